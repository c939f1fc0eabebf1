"""Share links: signed, revocable, read-only links to one run and its report, for a stakeholder
without an account (`/share/<token>` opens the run)."""

from __future__ import annotations

from fastapi import APIRouter, status
from pydantic import BaseModel

from app.api.deps import PrincipalDep, SessionDep, errors, get_or_404
from app.schemas import Timestamp
from app.services import accounts as actions
from data.accounts import ShareLink, list_shares, share_token
from data.models import Run

router = APIRouter(tags=["shares"])


class ShareOut(BaseModel):
    id: int
    run_id: int
    url: str
    created_by: str | None
    created_at: Timestamp
    revoked: bool


def share_out(link: ShareLink) -> ShareOut:
    return ShareOut(id=link.id, run_id=link.run_id, url=f"/share/{share_token(link)}",
                    created_by=link.created_by, created_at=link.created_at,
                    revoked=link.revoked_at is not None)


@router.post("/runs/{run_id}/shares", response_model=ShareOut, status_code=status.HTTP_201_CREATED,
             responses=errors(404))
def create_share_link(run_id: int, session: SessionDep, principal: PrincipalDep) -> ShareOut:
    """A new read-only link to this run; whoever has it sees the run and its report until revoked."""
    get_or_404(session, Run, run_id, "run")
    link, _token = actions.share_run(session, run_id, principal.name)
    return share_out(link)


@router.get("/runs/{run_id}/shares", response_model=list[ShareOut], responses=errors(404))
def list_share_links(run_id: int, session: SessionDep) -> list[ShareOut]:
    get_or_404(session, Run, run_id, "run")
    return [share_out(link) for link in list_shares(session, run_id)]


@router.delete("/shares/{share_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
def revoke_share_link(share_id: int, session: SessionDep) -> None:
    """The link stops working at once, for everyone who has it."""
    actions.revoke_link(session, get_or_404(session, ShareLink, share_id, "share link"))
