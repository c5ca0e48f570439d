"""``rc worker``: the agent that runs on a device host.

``config`` reads ``worker.yaml``; ``process`` is ``rc worker`` as a process (signals,
exit status, the end-to-end tests' two overrides); ``agent`` is one worker's life (start, register, heartbeat, poll,
shutdown); ``lifecycle`` is one job's life, step by step, from acquisition to release;
``channel`` is the typed conversation with the controller, one method per route, over
``h1.aio``;
``timings`` holds every wait and bound, injected; ``runner`` starts and supervises one
job's process group; ``procs`` is the only place that signals processes or reads
``/proc``; ``logship`` batches job output; ``stragglers`` ends a finished job's escaped
processes by their ``RC_JOB_ID``; ``outbox`` keeps terminal and fault reports on disk
until the controller answers for good; ``probes`` gathers the host facts sent at
registration; ``recovery`` decides the recovery proof sent with it; ``reconnect``
decides when to register again.
"""
