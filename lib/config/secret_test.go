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

// A URL with credentials is refused, and the refusal must not quote them:
// the message goes to the journal and to `config check`'s output.
func TestURLWithCredentialsIsRefusedWithoutQuotingThem(t *testing.T) {
	sha := strings.Repeat("0", 64)
	for name, edit := range map[string][2]string{
		"api-server": {`api-server = "https://127.0.0.1:1"`,
			`api-server = "https://abcdef:0123456789abcdef@127.0.0.1:1"`},
		"base-url with a token as user": {`base-url = "https://artifacts.example.internal"`,
			`base-url = "https://abcdef.0123456789abcdef@artifacts.example.internal"`},
		"override url": {"[allocation]",
			"[artifacts.overrides.kubelet]\nurl = \"https://mirror:0123456789abcdef@m.example/kubelet\"\nsha256 = \"" + sha + "\"\n[allocation]"},
		"unparsable url": {`base-url = "https://artifacts.example.internal"`,
			`base-url = "https://abcdef:0123456789abcdef@bad host/"`},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHost(t)
			h.edit("/etc/unbounded/agent.toml", edit[0], edit[1])
			_, errs := h.load() // fails the test if the token appears
			if errs == nil {
				t.Fatal("a URL with credentials was accepted")
			}
			if strings.Contains(errs.Error(), "0123456789abcdef") {
				t.Errorf("error quotes the credentials: %v", errs)
			}
		})
	}
}
