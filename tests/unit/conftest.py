"""Fixtures of the unit tier: ``small_table``, the hand-made ``vllm serve`` table loaded in
place of the shipped one (vllm_table_support.py)."""

from __future__ import annotations

from vllm_table_support import small_table  # noqa: F401 - a fixture, found by pytest by name
