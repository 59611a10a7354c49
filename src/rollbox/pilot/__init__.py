"""``rollbox pilot``: provisioning latency, throughput and cleanup under concurrency.

Modules: :mod:`.stats` (percentiles), :mod:`.raw` (the raw tools timed in the same run),
:mod:`.workloads` (what each rollout runs), :mod:`.measure` (the driver),
:mod:`.plot` (PNG), :mod:`.html` (self-contained report), :mod:`.table` (text table).
"""
