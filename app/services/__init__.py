"""Operations on the ORM that more than one route (or page) needs: validation of spans, the
generated errata, and building a run's snapshot. No HTTP here: errors are `Unprocessable`."""
