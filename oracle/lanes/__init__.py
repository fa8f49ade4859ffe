"""The lanes: checks that run beside the conformance suite on a GPU machine and serve every GPU
backend. The backend folders (``oracle/kernels/<backend>/``) hold only kernels, their build and
their registration; what exercises them from outside lives here.

- :mod:`.graphs`: the CUDA-graph replay lane (``python -m oracle.lanes.graphs --backend triton|cuda``):
  each scenario eagerly, then captured once and replayed with new inputs, bit for bit against the
  reference, guard bands intact; its scenarios and the backends they call are in
  :mod:`.graph_scenarios`.
- :mod:`.sanitize`: the compute-sanitizer lane (``oracle run --sanitize``, ``python -m
  oracle.lanes.sanitize``): the suite in one process under memcheck, errors attributed to tests
  by the marker plug-in :mod:`._sanitize_markers`.
- :mod:`.bad_kernels`: the fixture the sanitizer lane must catch, a deliberately wrong CUDA
  store_cache (``ORACLE_PLUGINS=oracle.lanes.bad_kernels:register``).
- :mod:`.gpu_check`: everything about the CUDA kernels in one call on a Hopper machine (build,
  unit tests, conformance, bench, sanitizer) within a time budget; its steps are in
  :mod:`.gpu_steps`.

Importing the package imports no lane; a lane imports the backends' kernels only when it runs
(:mod:`.bad_kernels`, a CUDA kernel itself, imports the CUDA build).
"""
