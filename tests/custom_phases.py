"""The advise tests' custom algorithm: ``benchmarks/bench_advise.py``'s phase table (graph
kinds in turn, every phase reading ``req_to_token``, read-done published after the last),
at 60 steps, so that the tests and the benchmark screen configs of the same shape."""


def custom_config(phases: int) -> dict:
    return {"name": f"custom-{phases}", "algorithm": "custom", "steps": 60, "warmup_steps": 10,
            "policy": {"barrier": "fine"},
            "phases": [{"name": f"p{i}", "graph": ("full", "eager", "breakable")[i % 3],
                        "load_batch_us": 5.0, "prep_us": 10.0, "body_us": 300.0,
                        "host_us": 10.0, "reads": ["req_to_token"],
                        "read_ends": "post_replay" if i == phases - 1 else "unknown"}
                       for i in range(phases)]}
