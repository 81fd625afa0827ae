"""``luftpause sim``: the scheduler's pure core and the engine model in virtual time (B1).

Nothing here opens a network socket, sleeps or reads a clock (``--workers`` talks to
its worker processes over local pipes). A discrete-event loop
(``world.World``) moves a virtual clock from one event to the next; the engine
replicas are the same ``EngineModel`` the fake engines serve
(``fleet.Replica`` steps it, as ``fakes.engine.server.driver`` does in real
time, in this process or in worker processes: ``partition``); own-loop agents
(``agents.Agent``) build their conversations with the same content, tools and reply
script as ``luftpause loadgen`` and the fake engine; and
an *arm* (``arms``) decides where and when each turn enters an engine:

* ``luftpause``: the scheduler's ``decide`` itself, fed the events the real
  service would feed it (turn requested, started, first token, finished; a probe
  of every replica's queue every ``probe_s``; a clock tick every second);
* ``router``: no admission; every turn placed by the SGLang router's ``cache_aware``
  policy (``placement``: a prefix tree of the texts it routed, balanced by load only
  when loads are far apart);
* ``smg``, ``smg-capC``, ``smg-fifoC``: the SGLang Model Gateway, sticky sessions, a
  run's first turn placed by its ``--policy`` (``cache_aware`` by default: the prefix
  tree, then the least expected wait from the engines' load as SMG last polled it), and
  its priority scheduler or FIFO cap;
* ``engine-prio``: agent *i* pinned to replica *i* mod N, the engines ordering
  their queues by a per-class ``priority`` (as ``tools/bench/flood.py`` runs it).

Runs, turns and errors are recorded as ``measure.stats`` records, so the report
is the load generator's table. Everything is a function of the seed. ``run`` is one
simulation (a load, its replicas and an arm), ``sweep`` runs it over replica counts or
targets, ``main`` is the command line.
"""
