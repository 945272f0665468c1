"""Load planning, with no database: will a model fit (memory), the check before every load and
the automatic context (preflight), and the readings of the machine itself (machine). It runs
where the engine runs: in the web process when embedded, in an inference worker in split mode.
"""
