"""The playbooks of vllm-provision (data, not code): shipped in the wheel as
vllm_provision.resources.playbooks so that importlib.resources finds them."""
