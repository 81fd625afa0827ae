"""The dataplane's routes, one module per API, and a turn's path through them.

A chat turn: ``DataplaneApp`` (``asgi.py``) calls ``generative.chat_route`` →
authenticate (D9) and read the body (``inbound.py``) → parse and validate every field
the proxy reads or rewrites (``request.py``; another client API's body through its
module in ``apis/``, ``translated.py``) → resolve run, class, caller (D2, D3,
``identity.py``) → unknown model is a 404 before queueing (S6), images for a model not
every endpoint of which sets ``vision = true`` a 400 (B9) → admit through the
scheduler (``admission.py``), waiting with no deadline, abandoning if the client
leaves (D4) → from here a ``Turn`` owns the turn's lifetime (``turn.py``): it is
ended exactly once, by a route or by the stream relay → ``placing.py`` serves it:
forward to the admitted replica with that replica's own key (``chat.py``,
``engine.py``) → relay the reply unchanged (``relay.py``) → report started, first
token, finished or failed (D5, ``link_codec.py``). A turn whose engine connection
failed (so the engine never saw it) is admitted once more, elsewhere, as a new turn
(``placing.serve_placing_again``).

Failures are raised as ``errors.TurnError`` members, which carry their outcome and
their HTTP answer (D6). Anything else a route raises is a bug of ours: it is logged
with its traceback and answered as a JSON 500 (``asgi.py``), and an admitted turn it
interrupts still ends.
"""
