package v1alpha3

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/randfill"
)

// mutate changes every exported leaf reachable from v in place: strings,
// numbers and bools, and the values behind pointers, in slices and in maps.
// After a deep copy, mutating the copy must leave the original unchanged;
// a shallow copy of any pointer, slice or map shows up as a change.
func mutate(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			mutate(v.Elem())
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			if v.CanSet() {
				v.Set(reflect.ValueOf(v.Interface().(time.Time).Add(time.Hour)))
			}
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				mutate(v.Field(i))
			}
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			mutate(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			mutate(e)
			v.SetMapIndex(k, e)
		}
	case reflect.String:
		if v.CanSet() {
			v.SetString(v.String() + "-mutated")
		}
	case reflect.Bool:
		if v.CanSet() {
			v.SetBool(!v.Bool())
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.CanSet() {
			v.SetInt(v.Int() + 1)
		}
	}
}

func TestDeepCopyIsEqualAndSharesNothing(t *testing.T) {
	objects := []runtime.Object{
		&Machine{}, &MachineList{},
		&MachineOperation{}, &MachineOperationList{},
		&MachineAllocation{}, &MachineAllocationList{},
	}
	// Managed fields hold raw JSON or CBOR, which random bytes are not; they
	// are apimachinery's to copy, so they stay empty here.
	f := randfill.NewWithSeed(1).NilChance(0).NumElements(1, 3).Funcs(
		func(m *metav1.ObjectMeta, c randfill.Continue) {
			c.FillNoCustom(m)
			m.ManagedFields = nil
		},
	)
	for _, obj := range objects {
		name := reflect.TypeOf(obj).Elem().Name()
		t.Run(name, func(t *testing.T) {
			for i := 0; i < 20; i++ {
				f.Fill(obj)
				before, err := json.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				cp := obj.DeepCopyObject()
				if !equality.Semantic.DeepEqual(obj, cp) {
					t.Fatalf("DeepCopyObject differs from the original")
				}
				mutate(reflect.ValueOf(cp))
				after, err := json.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				if string(before) != string(after) {
					t.Fatalf("changing the copy changed the original:\nbefore %s\nafter  %s", before, after)
				}
			}
		})
	}
}

func TestSchemeRoundTripsEveryKind(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	m := &Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "site-w1"},
		Spec: MachineSpec{
			Kubernetes: KubernetesSpec{Version: "1.36.3", NodeLabels: map[string]string{"a": "b"}},
			Isolation:  IsolationSpec{Mode: IsolationNone},
			Allocation: &AllocationRef{Name: "alloc", UID: "1234", Fenced: true},
		},
		Status: MachineStatus{Phase: MachineReady, Isolation: &IsolationStatus{Mode: IsolationNone}},
	}
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		t.Fatal("no JSON serializer")
	}
	enc := codecs.EncoderForVersion(info.Serializer, SchemeGroupVersion)
	data, err := runtime.Encode(enc, m)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"apiVersion":"unbounded-cloud.io/v1alpha3"`) || !strings.Contains(string(data), `"kind":"Machine"`) {
		t.Fatalf("encoded Machine lacks its type: %s", data)
	}
	got, _, err := codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	back, ok := got.(*Machine)
	if !ok {
		t.Fatalf("decoded %T, want *Machine", got)
	}
	m.TypeMeta = back.TypeMeta
	if !equality.Semantic.DeepEqual(m, back) {
		t.Fatalf("round trip changed the Machine:\n%#v\n%#v", m, back)
	}
	for _, kind := range []string{"Machine", "MachineList", "MachineOperation", "MachineOperationList", "MachineAllocation", "MachineAllocationList"} {
		if !scheme.Recognizes(SchemeGroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not recognise %s", kind)
		}
	}
}

func TestOnlyCompleteAndFailedAreFinished(t *testing.T) {
	for s, want := range map[OperationState]bool{OperationPending: false, OperationInProgress: false, OperationComplete: true, OperationFailed: true, "": false} {
		if s.Finished() != want {
			t.Errorf("%q.Finished() = %v, want %v", s, !want, want)
		}
	}
}
