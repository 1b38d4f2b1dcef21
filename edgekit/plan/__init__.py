"""Planning a set of tasks on a device (paper 003: SD over heterogeneous edge networks).

- `ModelShape`, `Runtime` (`_cost`): FLOPs of draft and verify passes from a model's
  shape (eqs. 9-14) and run time from FLOPs and batch size (eq. 17), fitted per machine.
- `ServingModel` (`_latency`): the two-stage pipeline's total latency for batches of
  tasks and a speculation length (eqs. 7, 8, 18-22), with the link in the second stage.
- `plan`, `batches_for_window`, `exhaustive` (`_dp`): Algorithm 1's dynamic program over
  tasks sorted by input length, the window by enumeration (P3), and brute force to
  check it on small cases.
- `calibrate_draft`, `calibrate_verify` (`_calibrate`): eq. 17 fitted on this device and from
  the verifier's reported times.
- `Phaser`, `Paced` (`_pace`): running a plan, a batch's tasks starting each round together
  (`EdgeClient.generate_many(prompts, plan=...)`).

The paper's bandwidth allocation across users (sec. III-A) belongs to whoever runs the
radio network, not to a device; docs/concepts/pipelining.md says how an operator would
use it.
"""

from ._calibrate import calibrate_draft, calibrate_verify, verifier_shape
from ._cost import ModelShape, Runtime
from ._dp import Plan, batches_for_window, exhaustive, plan
from ._pace import Paced, Phaser
from ._serving import ServingModel

__all__ = [
    "ModelShape",
    "Paced",
    "Phaser",
    "Plan",
    "Runtime",
    "ServingModel",
    "batches_for_window",
    "calibrate_draft",
    "calibrate_verify",
    "exhaustive",
    "plan",
    "verifier_shape",
]
