package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestDropinsOverrideKeyByKeyInLexicalOrder(t *testing.T) {
	h := newHost(t)
	// 20 sorts after 10 and wins; 10's other keys stay.
	h.write(dropinDir+"/20-dns.toml", "[cluster]\ncluster-dns = \"10.0.0.53\"\n", 0o644)
	h.write(dropinDir+"/10-site.toml", "mode = \"none\"\n[cluster]\ncluster-dns = \"10.0.0.10\"\n", 0o644)
	h.write(dropinDir+"/README", "not a drop-in: no .toml suffix, never read\n", 0o644)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatal(errs)
	}
	if cfg.Cluster.ClusterDNS != "10.0.0.53" || cfg.Mode != "none" {
		t.Errorf("cluster-dns = %q (want 20's), mode = %q (want 10's)", cfg.Cluster.ClusterDNS, cfg.Mode)
	}
	if cfg.Cluster.APIServer != "https://127.0.0.1:1" {
		t.Errorf("a section in a drop-in dropped the main file's other keys: %+v", cfg.Cluster)
	}
	want := []string{h.path(mainFile), h.path(dropinDir + "/10-site.toml"), h.path(dropinDir + "/20-dns.toml")}
	if !reflect.DeepEqual(cfg.Files, want) {
		t.Errorf("Files = %v, want %v", cfg.Files, want)
	}
}

func TestDropinsReplaceArraysAndMapsWhole(t *testing.T) {
	h := newHost(t)
	h.write(dropinDir+"/50-node.toml", "[node]\nlabels = { \"rack\" = \"r7\" }\ntaints = []\n", 0o644)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatal(errs)
	}
	if !reflect.DeepEqual(cfg.Node.Labels, map[string]string{"rack": "r7"}) {
		t.Errorf("labels = %v, want only the drop-in's", cfg.Node.Labels)
	}
	if len(cfg.Node.Taints) != 0 {
		t.Errorf("taints = %v, want the drop-in's empty list", cfg.Node.Taints)
	}
}

func TestDropinsAloneAreAConfig(t *testing.T) {
	h := newHost(t)
	h.write(dropinDir+"/00-all.toml", validConfig, 0o644)
	if err := os.Remove(h.path(mainFile)); err != nil {
		t.Fatal(err)
	}
	if _, errs := h.load(); errs != nil {
		t.Errorf("config in a drop-in only rejected: %v", errs)
	}
}

func TestLaterValidDropinFixesAnEarlierWrongType(t *testing.T) {
	h := newHost(t)
	h.edit(mainFile, `cluster-dns = "10.96.0.10"`, `cluster-dns = 10`)
	h.write(dropinDir+"/90-fix.toml", "[cluster]\ncluster-dns = \"10.96.0.10\"\n", 0o644)
	_, errs := h.load()
	// The wrong type in the main file is still an error (the file is
	// wrong), but the value is not reported twice.
	if len(errs) != 1 || errs[0].Key != "cluster.cluster-dns" || errs[0].Line != 9 {
		t.Errorf("want exactly the type error at line 9, got %v", errs)
	}
}

// The reference is the one place where defaults live: it must load as a
// layer, and every key of Config must be in it, either with its default or
// commented out as REQUIRED.
func TestReferenceDocumentsEveryKey(t *testing.T) {
	tree := map[string]any{}
	md, err := toml.Decode(Reference, &tree)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(tree, configType, nil, func(k toml.Key, msg string) { t.Errorf("reference.toml: %s: %s", k, msg) })
	var walk func(rt reflect.Type, key toml.Key)
	walk = func(rt reflect.Type, key toml.Key) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "" || name == "-" {
				continue
			}
			sub := addKey(key, name)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[Duration]() {
				walk(f.Type, sub)
				continue
			}
			if md.IsDefined(sub...) {
				continue
			}
			// A required key: commented out, marked REQUIRED just above.
			re := regexp.MustCompile(`# REQUIRED\.[^\n]*\n(#[^\n]*\n)*# ` + regexp.QuoteMeta(name) + ` = `)
			if !re.MatchString(Reference) {
				t.Errorf("%s has neither a default nor a REQUIRED example in reference.toml", sub)
			}
		}
	}
	walk(configType, nil)
}
