package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestReadBootstrapTokenRevealsOnlyThroughReveal(t *testing.T) {
	h := newHost(t)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatal(errs)
	}
	tok, err := cfg.ReadBootstrapToken()
	if err != nil {
		t.Fatal(err)
	}
	if tok.Reveal() != testToken {
		t.Fatalf("Reveal() = %q", tok.Reveal())
	}
	holder := struct {
		Exported Secret
		hidden   Secret
	}{tok, tok}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("token", "t", tok, "holder", holder)
	js, _ := json.Marshal(holder)
	for _, out := range []string{
		fmt.Sprint(tok), fmt.Sprintf("%v %+v %#v %s %q %x", tok, tok, tok, tok, tok, tok),
		fmt.Sprintf("%v %+v %#v", holder, holder, holder),
		logged.String(), string(js),
	} {
		if strings.Contains(out, testToken) || strings.Contains(out, "abcdef") {
			t.Errorf("token printed: %s", out)
		}
	}
}

func TestReadBootstrapTokenRechecksTheFile(t *testing.T) {
	h := newHost(t)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatal(errs)
	}
	h.write("/etc/unbounded/bootstrap-token", "rotated-but-malformed\n", 0o600)
	if _, err := cfg.ReadBootstrapToken(); err == nil || strings.Contains(err.Error(), "rotated") {
		t.Errorf("malformed token accepted or quoted: %v", err)
	}
}
