"""The answer to an Admit request: the admission decision plus what the pool would do."""

from __future__ import annotations

from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb
from service.admission import Decision
from service.models.memory import format_bytes
from service.models.pool import Plan


@dataclass(frozen=True)
class AdmissionReport:
    decision: Decision
    weights_bytes: int
    kv_cache_bytes: int
    plan: Plan
    budget_bytes: int
    used_bytes: int
    loaded: bool

    @property
    def admitted(self) -> bool:
        return self.decision.admitted and self.plan.fits_at_all

    @property
    def reason(self) -> str:
        if self.decision.admitted and not self.plan.fits_at_all:
            return (
                f"{self.decision.reason}, but it needs about {format_bytes(self.plan.need)}, "
                f"more than the memory budget of {format_bytes(self.budget_bytes)}"
            )
        return self.decision.reason

    def to_pb(self) -> pb.AdmitResponse:
        description = self.decision.description
        return pb.AdmitResponse(
            admitted=self.admitted,
            reason=self.reason,
            backend=self.decision.backend,
            architecture=description.architecture if description else "",
            quantization=description.quantization.to_pb() if description else None,
            memory=pb.MemoryEstimate(
                weights_bytes=self.weights_bytes,
                kv_cache_bytes=self.kv_cache_bytes,
                total_bytes=self.weights_bytes + self.kv_cache_bytes,
                budget_bytes=self.budget_bytes,
                free_bytes=max(self.budget_bytes - self.used_bytes, 0),
                fits=self.plan.fits_at_all,
                would_evict=list(self.plan.evict),
            ),
            loaded=self.loaded,
            available_locally=self.decision.available_locally,
        )
