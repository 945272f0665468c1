"""The split-mode harness the tests share: real Redis, real inference worker processes, a
SplitClient in the test process (fixtures), and helpers to drive them. Split mode's tests run in
a pytest run of their own on PostgreSQL (the Makefile's SPLIT_TESTS)."""
