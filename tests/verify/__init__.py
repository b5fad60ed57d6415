"""The verify suite: pytest-testinfra checks of a deployed replica, shipped in the wheel as
vllm_provision.resources.verify (run it with `provision verify -i INVENTORY`)."""
