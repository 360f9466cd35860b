"""The fake Kubernetes API server (spec/support/fake-apiserver), one module per job.

Independent of the engine on purpose: it shares none of its JSON or patch
code, so a bug there cannot hide behind the same bug here.  Standard library
plus Debian's python3-jsonpatch; spec/support/README.md has the contract and
a line on each module.
"""
