"""kit.doctor.reconcile on real traces: one finding, one cost."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.doctor import diagnose

ITEM = Path(__file__).parent / "data" / "doctor" / "item"


@pytest.mark.skipif(not ITEM.exists(), reason="test data not here")
def test_a_signature_rule_states_the_accounted_cost_throughout():
    """host_sync fires with its own estimate (the GPU idle after each sync); the accounting charges it less. The
    finding states one cost: the accounted one, on every rank it lists; its sentence calls its own number the
    rule's estimate, which stays in the evidence."""
    d = diagnose(sorted(ITEM.glob("*.json*")), workers=1)
    f = next(f for f in d.findings if f.rule == "host_sync")
    per = f.evidence["per_rank"]
    assert f.cost_us_per_step == f.evidence["accounted_us_per_step"] == max(n["cost_us_per_step"]
                                                                              for n in per.values())
    assert f.evidence["rule_estimate_us_per_step"] > f.cost_us_per_step
    assert all(n["rule_estimate_us_per_step"] >= n["cost_us_per_step"] for n in per.values())
    assert f"the rule's estimate, {f.evidence['rule_estimate_us_per_step']:.0f} us" in f.summary
    assert f"charges it {f.cost_us_per_step:.0f} us per step" in f.summary
