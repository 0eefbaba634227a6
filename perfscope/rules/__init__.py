"""The rule table: symptom -> evidence -> fix, GEMM-aware (issue 5).

    from perfscope.rules import evaluate
    ev = evaluate(profile)                 # manifest= and context= are optional
    for f in ev.findings: print(f.severity, f.code, f.title, f.estimated_gain)
    ev.not_evaluated                       # rules whose inputs the report lacks, and why

One module per concern (memory, latency, registers, instructions, launch, cache,
correctness); ``registry.REGISTRY`` is the one tuple that lists them.
"""

from perfscope.rules.engine import evaluate
from perfscope.rules.model import (
    SEVERITIES,
    TAGS,
    Context,
    Evaluation,
    Evidence,
    Finding,
    Hit,
    Inputs,
    NotCollected,
    NotEvaluated,
    Rule,
)
from perfscope.rules.registry import BY_CODE, REGISTRY, STATIC_REGISTRY, RuleTable, read_metrics, rule_metrics

__all__ = [
    "BY_CODE", "REGISTRY", "SEVERITIES", "STATIC_REGISTRY", "TAGS", "Context", "Evaluation",
    "Evidence", "Finding", "Hit", "Inputs", "NotCollected", "NotEvaluated", "Rule", "RuleTable",
    "evaluate",
    "read_metrics",
    "rule_metrics",
]
