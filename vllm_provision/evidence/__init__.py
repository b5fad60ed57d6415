"""Evidence for choosing a backend: ``provision bench``, ``provision fault``, ``provision record``.

Method, the meaning of each number and the limits: docs/evidence.md. Modules:
``stats`` (percentiles, Prometheus histogram deltas), ``load`` (the streaming load generator),
``placement`` (where each rank or Ray bundle runs), ``store`` (results in the controller's state
folder), ``bench``, ``fault`` and ``record`` (the three experiments and the decision record).
"""
