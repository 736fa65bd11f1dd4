"""Placement policy: a pure function shared by the controller and the simulator
(``placement.plan``), with what it is built from: predictions, priority, sharing, limits."""
