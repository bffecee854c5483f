"""The answer to an Admit request: the admission decision plus what the pool would do."""

from __future__ import annotations

from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb
from service.admission import Decision
from service.engine.base import MeasuredMemory
from service.hub.download import Download
from service.memory import MemoryNeed
from service.models.pool import Plan, PoolLimits, too_big


@dataclass(frozen=True)
class AdmissionReport:
    decision: Decision
    need: MemoryNeed
    plan: Plan
    limits: PoolLimits
    used_bytes: int
    used_device_bytes: int
    loaded: bool
    # What the loaded model's engine holds, measured; None when not loaded or not apart.
    measured: MeasuredMemory | None = None

    @property
    def admitted(self) -> bool:
        return self.decision.admitted and self.plan.fits_at_all

    @property
    def reason(self) -> str:
        if self.decision.admitted and not self.plan.fits_at_all:
            return f"{self.decision.reason}, but it {too_big(self.plan, self.limits)}"
        return self.decision.reason

    def to_pb(self) -> pb.AdmitResponse:
        description = self.decision.description
        budget, device_budget = self.limits.budget_bytes, self.limits.device_budget_bytes
        memory = pb.MemoryEstimate(
            weights_bytes=self.need.weights_bytes,
            kv_cache_bytes=self.need.kv_cache_bytes,
            parked_bytes=self.need.parked_bytes,
            compute_bytes=self.need.compute_bytes,
            total_bytes=self.need.total_bytes,
            budget_bytes=budget,
            free_bytes=max(budget - self.used_bytes, 0),
            fits=self.plan.fits_at_all,
            would_evict=list(self.plan.evict),
            host_bytes=self.need.host_bytes,
            device_bytes=self.need.device_bytes,
        )
        if self.measured is not None:
            memory.measured_rss_bytes = self.measured.rss_bytes
            memory.measured_gpu_bytes = self.measured.gpu_bytes
        if device_budget is not None:
            memory.device_budget_bytes = device_budget
            memory.device_free_bytes = max(device_budget - self.used_device_bytes, 0)
        download = self.decision.download
        return pb.AdmitResponse(
            download=download_pb(download) if download is not None else None,
            admitted=self.admitted,
            reason=self.reason,
            backend=self.decision.backend,
            architecture=description.architecture if description else "",
            quantization=description.quantization.to_pb() if description else None,
            memory=memory,
            loaded=self.loaded,
            available_locally=self.decision.available_locally,
        )


def download_pb(download: Download) -> pb.HubDownload:
    return pb.HubDownload(
        repo=download.repo_id,
        commit=download.commit,
        files=[pb.HubFile(path=path, size_bytes=size) for path, size in download.files.items()],
        total_bytes=download.total_bytes,
        disk_free_bytes=download.free_bytes,
        fits_on_disk=download.fits_on_disk,
        choices=[pb.HubFile(path=path, size_bytes=size) for path, size in download.choices.items()],
    )
