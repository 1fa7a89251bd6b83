"""What the tests share: the process harness (procs.py), the one way to get ports (ports.py),
the numpy reference (reference.py), the fault cluster (cluster.py), and the worker scripts the
multi-process tests start (workers.py, fault_worker.py, formation_worker.py,
elastic_worker.py)."""
