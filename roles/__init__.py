"""The roles of vllm-provision (data, not code): shipped in the wheel as
vllm_provision.resources.roles so that importlib.resources finds them."""
