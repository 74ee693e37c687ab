package main

import (
	"os/exec"
	"strings"
)

func gitCommitTime() (string, error) {
	out, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
	return strings.TrimSpace(string(out)), err
}
