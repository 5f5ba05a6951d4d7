"""LLM batching schemes of the reference papers, simulated side by side with SMDP-optimal batching.

* :mod:`.multibin` — closed forms of multi-bin batching (papers 000/003).
* :mod:`.binsim` — request-level multi-bin simulator (fixed B, max wait, per-bin tables, errors).
* :mod:`.perbin` — paper 004's SMDP solved per bin (max-of-b batch times) → per-bin tables.
* :mod:`.workload`, :mod:`.engine` — LLM requests (prompt/output tokens) and an iteration-level
  serving engine with prefill + decode steps and a KV-cache memory cap (papers 001/002).
* :mod:`.bucketserve` — BucketServe (paper 001); :mod:`.memaware` — paper 002's Alg. 1 and Alg. 2.
"""
