"""Lab stand-in for vLLM: behaves like ``vllm serve`` at the process and protocol level, no GPU.

Shipped into each lab guest's venv (``/opt/vllm/lib/python3.11/site-packages/``); started as
``/opt/vllm/bin/vllm``. Standard library only, plus the real ``ray`` in Ray mode. Lab only: it
says so in ``vllm --version`` logs and at start. See docs/lab-standin.md for what it reproduces.
"""
