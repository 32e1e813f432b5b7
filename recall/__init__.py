"""Two-tower recall (torch + faiss), the popularity channel, the extra channels and the merge.

Importing this package sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment says
otherwise (it takes effect only when torch, faiss and LightGBM load their OpenMP runtimes
after this import, which is the order of every ``recsys`` command that trains). With
libgomp's default (active) policy an idle OpenMP worker spins on its core after every
parallel region; on a machine whose cores other jobs use, the spinning threads and the
preempted ones stall each other at every barrier. Measured on the 2-core box under load 5
(two-tower step, ML-100K shapes): 1 thread 560-900 ms/step, 2 threads active 2100-3600 ms,
2 threads passive 680-970 ms (``recall.train`` module doc has the full-run figures).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
