"""``rc worker``: the agent that runs on a device host.

``config`` reads ``worker.yaml``; ``agent`` talks to the controller and owns the job
tasks; ``runner`` runs one job as a supervised process group; ``procs`` is the only
place that signals processes or reads ``/proc``; ``logship`` batches job output;
``probes`` gathers the host facts sent at registration.
"""
