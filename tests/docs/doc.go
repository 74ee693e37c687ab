// Package docs checks the commands the README shows (and tests/README.md)
// against the code, in the unit tier: each command in a fenced ```sh block
// is parsed by the kong model of the command it runs, or its unit, make
// target, man page or host path is looked up where the code defines it.
// Commands it cannot check are accepted only by name, from a list that
// says why. tests/README.md states the convention the documents follow.
package docs
