"""Initial schema: notebooks, fields, errata, skills, placements, questions, runs, run results.

Reviewed by hand from autogenerate. Constraint names follow `data.models.NAMING_CONVENTION`
(`pk_<table>`, `fk_<table>_<column>_<referred>`, `ck_<table>_<name>`, `ix_<table>_<column>`).
Deleting a notebook cascades to its fields, errata, placements and questions, but only sets
`runs.notebook_id` to NULL: a run and its results outlive the notebook they ran on.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False)


def _notebook_id(nullable: bool = False, ondelete: str = "CASCADE", table: str = "") -> sa.Column:
    return sa.Column(
        "notebook_id",
        sa.Integer(),
        sa.ForeignKey("notebooks.id", ondelete=ondelete, name=f"fk_{table}_notebook_id_notebooks"),
        nullable=nullable,
    )


def upgrade() -> None:
    op.create_table(
        "notebooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        _created_at(),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_notebooks"),
    )
    op.create_table(
        "skills",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=True),
        sa.Column("store_key", sa.String(length=200), nullable=True),
        sa.Column("compile_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        _created_at(),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status IN ('draft', 'compiling', 'compiled', 'failed')", name="ck_skills_status"),
        sa.PrimaryKeyConstraint("id", name="pk_skills"),
    )
    op.create_table(
        "fields",
        sa.Column("id", sa.Integer(), nullable=False),
        _notebook_id(table="fields"),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("end", sa.Integer(), nullable=False),
        sa.Column("old_value", sa.Text(), nullable=False),
        sa.Column("new_value", sa.Text(), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        _created_at(),
        sa.CheckConstraint('start >= 0 AND start < "end"', name="ck_fields_span"),
        sa.PrimaryKeyConstraint("id", name="pk_fields"),
    )
    op.create_index("ix_fields_notebook_id", "fields", ["notebook_id"])

    op.create_table(
        "errata",
        sa.Column("id", sa.Integer(), nullable=False),
        _notebook_id(table="errata"),
        sa.Column(
            "field_id",
            sa.Integer(),
            sa.ForeignKey("fields.id", ondelete="SET NULL", name="fk_errata_field_id_fields"),
            nullable=True,
        ),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        _created_at(),
        sa.CheckConstraint("source IN ('generated', 'custom')", name="ck_errata_source"),
        sa.PrimaryKeyConstraint("id", name="pk_errata"),
    )
    op.create_index("ix_errata_notebook_id", "errata", ["notebook_id"])
    op.create_index("ix_errata_field_id", "errata", ["field_id"])

    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), nullable=False),
        _notebook_id(table="placements"),
        sa.Column(
            "skill_id",
            sa.Integer(),
            sa.ForeignKey("skills.id", ondelete="CASCADE", name="fk_placements_skill_id_skills"),
            nullable=False,
        ),
        sa.Column("position", sa.Integer(), nullable=True),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_placements"),
    )
    op.create_index("ix_placements_notebook_id", "placements", ["notebook_id"])
    op.create_index("ix_placements_skill_id", "placements", ["skill_id"])

    op.create_table(
        "questions",
        sa.Column("id", sa.Integer(), nullable=False),
        _notebook_id(table="questions"),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("choices", sa.JSON(), nullable=False),
        sa.Column("cot", sa.Boolean(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_questions"),
    )
    op.create_index("ix_questions_notebook_id", "questions", ["notebook_id"])

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        _notebook_id(nullable=True, ondelete="SET NULL", table="runs"),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("snapshot", sa.JSON(), nullable=False),
        sa.Column("strategies", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        _created_at(),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("timings", sa.JSON(), nullable=False),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name="ck_runs_status"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_notebook_id", "runs", ["notebook_id"])
    op.create_index("ix_runs_status", "runs", ["status"])

    op.create_table(
        "run_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "run_id",
            sa.Integer(),
            sa.ForeignKey("runs.id", ondelete="CASCADE", name="fk_run_results_run_id_runs"),
            nullable=False,
        ),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("decision", sa.Text(), nullable=False),
        sa.Column("choice_probs", sa.JSON(), nullable=False),
        sa.Column("kl_to_recompute", sa.Float(), nullable=False),
        sa.Column("top1_agrees", sa.Boolean(), nullable=False),
        sa.Column("topk_overlap", sa.Integer(), nullable=False),
        sa.Column("logit_cosine", sa.Float(), nullable=False),
        sa.Column("decision_matches_recompute", sa.Boolean(), nullable=False),
        sa.Column("tokens_computed", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        # float16 bytes [layers, heads, T]: bytea on PostgreSQL, BLOB on SQLite
        sa.Column("attention", sa.LargeBinary(), nullable=True),
        sa.Column("attention_shape", sa.JSON(), nullable=True),
        sa.Column("tokens", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_run_results"),
        sa.UniqueConstraint("run_id", "strategy", name="uq_run_results_run_id_strategy"),
    )
    op.create_index("ix_run_results_run_id", "run_results", ["run_id"])


def downgrade() -> None:
    # Children before parents; dropping a table drops its indexes.
    for table in (
        "run_results",
        "runs",
        "questions",
        "placements",
        "errata",
        "fields",
        "skills",
        "notebooks",
    ):
        op.drop_table(table)
