"""Test stand-in for triton, CPU tests only: sglang imports triton at module level
(sglang/srt/utils/common.py) but parsing server arguments never uses it. Not shipped."""
