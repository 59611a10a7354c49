"""``rollbox audit``: adversarial probes run inside real sandboxes, with evidence.

Modules: :mod:`.models` (results), :mod:`.context` (the sandboxes and host-side canaries a
run sets up), :mod:`.scripts` (the programs run inside), :mod:`.probes_*` (one function per
probe), :mod:`.runner` (runs the probes, in order), :mod:`.repro` (``--repro``).
"""
