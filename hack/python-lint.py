#!/usr/bin/python3
"""Lint the project's Python (hack/lint.sh), with the standard library alone:

  every file compiles;
  no name a function, class or module body reads is left undefined (neither
  bound in its module, imported nor a builtin): what a module split or a
  renamed helper leaves behind, found before a spec runs into it;
  and in the fake API server (spec/support/fake-apiserver and its package
  spec/support/fakeapi/) no function is longer than MAX_FUNCTION_LINES.

Usage: hack/python-lint.py FILE...   (exit 1 on any finding)
"""

import ast
import builtins
import os
import symtable
import sys

MAX_FUNCTION_LINES = 80
LENGTH_CHECKED = ("spec/support/fake-apiserver", "spec/support/fakeapi/")
MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__",
                "__builtins__", "__path__"}


def bound_at_module(table):
    return {s.get_name() for s in table.get_symbols()
            if s.is_assigned() or s.is_imported() or s.is_namespace()}


def undefined_names(table, defined, out):
    """(line-less) names read in table and its children that resolve to the
    module scope but are not bound there."""
    for s in table.get_symbols():
        name = s.get_name()
        if not s.is_referenced() or name in defined:
            continue
        if table.get_type() == "module":
            unbound = not (s.is_assigned() or s.is_imported() or s.is_namespace())
        else:
            unbound = s.is_global()
        if unbound:
            out.add((name, table.get_name()))
    for child in table.get_children():
        undefined_names(child, defined, out)


def check(path, text):
    findings = []
    try:
        tree = ast.parse(text, path)
        table = symtable.symtable(text, path, "exec")
    except SyntaxError as e:
        return ["%s:%s: does not compile: %s" % (path, e.lineno, e.msg)]
    defined = bound_at_module(table) | set(dir(builtins)) | MODULE_NAMES
    missing = set()
    undefined_names(table, defined, missing)
    for name, scope in sorted(missing):
        findings.append("%s: undefined name %r (in %s)" % (path, name, scope))
    rel = os.path.relpath(path)
    if rel.startswith(LENGTH_CHECKED):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    findings.append("%s:%d: function %s is %d lines (at most %d: split it by job)"
                                    % (path, node.lineno, node.name, lines, MAX_FUNCTION_LINES))
    return findings


def main(paths):
    findings = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            findings.extend(check(path, f.read()))
    for line in findings:
        print(line)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
