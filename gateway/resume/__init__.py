"""Resumable streams (docs/resume.md): a stream's events logged as relayed, served
again from any cursor by any replica, and the generation finished detached.

``recorder`` logs one stream's whole events (the guard's, ``gateway.guard.whole``)
and detaches it when its client leaves; ``service`` answers the resume and cancel
endpoints; ``takeover`` ends a stream whose writer died (continued, or
``owner_lost``);
``responses`` is the Responses API's ``GET /responses/{id}?stream=true``. The logs
are kept by ``gateway.store``.
"""

from gateway.resume.service import Resumes, build_resumes

__all__ = ["Resumes", "build_resumes"]
