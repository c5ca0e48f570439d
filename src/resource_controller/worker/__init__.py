"""``rc worker``: the agent that runs on a device host.

``process`` is ``rc worker`` as a process, ``agent`` one worker's life, ``lifecycle``
one job's; ``channel`` talks to the controller and ``procs`` alone touches other processes.
"""
