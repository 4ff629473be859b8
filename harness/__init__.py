"""What the demo, the tests and the benchmarks start around the product: real binaries
(Prometheus, Alertmanager, promtool, vmalert) and our own services as processes, stand-ins for what
cannot run here (the W&B API, the Kubernetes API), and realistic Alertmanager payloads.

Imports the product (``wandb_infra.*``) only; never ``demo``, ``tests`` or ``bench``."""
