"""Placement: the cluster inventory, the placement policies and their simulator core, and the plan step.

Owns: ``inventory`` (the one parser of cluster inventories: inventory files and ``kubectl get nodes -o json``;
re-exports the names of the three modules it builds on: ``views``, the parsed inventory and its views per
consumer; ``fields``, YAML with line numbers and the field checks; ``k8s_nodes``, Kubernetes nodes),
``policies`` (the policies and Gavel's max-min allocation; it re-exports the three below, and its names are also
this package's), ``state`` (jobs, decisions, the simulator's state), ``clusters`` (throughput tables and
inventories to place on), ``rounds`` (placement rounds and reclaim), ``scoring`` (the plan step's score of each
candidate and why the winner won), ``podplace`` (the placed pod: the chosen model's node affinity, HAMi fractional-GPU
resources), ``plan`` (the plan step), ``vectors`` (requests and nodes as resource vectors: CPU, memory, devices and
shares of one device), ``packing`` (node-packing policies behind one score interface, and the fill replay) ``fgd``
(fragmentation gradient descent, Weng et al., ATC'23), ``podlists`` (pod and node lists in the Alibaba 2023 CSV layout)
and ``packplan`` (the plan step under a packing policy: request vectors of the candidates, FGD's workload distribution).
May import: ``heteroflow.components.core``, ``devices``, ``errors``, ``heteroflow.cache``.
"""

from heteroflow.components.core.lazy import names_from

__getattr__ = names_from(__name__, "heteroflow.components.placement.policies")
