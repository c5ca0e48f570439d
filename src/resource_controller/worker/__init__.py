"""``rc worker``: the agent that runs on a device host.

``config`` reads ``worker.yaml``; ``agent`` talks to the controller and owns the job
tasks; ``runner`` runs one job as a supervised process group; ``procs`` is the only
place that signals processes or reads ``/proc``; ``logship`` batches job output;
``probes`` gathers the host facts sent at registration; ``recovery`` decides the
recovery proof sent with it; ``reconnect`` decides when to register again; ``outbox``
keeps terminal and fault reports on disk until the controller answers for good;
``sweep`` ends a finished job's escaped processes by their ``RC_JOB_ID``; ``answers``
reads the controller's replies; ``testhooks`` holds the end-to-end tests' overrides.
"""
