"""The results pages ``docs/results/{graphs,text,vision}.md``: hand-written conclusions around
tables generated from the run JSONs under ``results/{graphs,text,vision}/``.

``graphs``, ``text`` and ``vision`` each build a page's tables (``tables(results)``, by block
key) and figures, and run as ``scripts/report_{graphs,text,vision}.py``; ``page`` fills a page's
``<!-- table: KEY -->`` blocks and holds the command line; ``paired`` computes every stated
effect (the mean per-seed paired difference with its 95% t-interval).
"""
