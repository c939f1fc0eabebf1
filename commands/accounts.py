"""`kvnotes users …` and `kvnotes tokens …`: the accounts of a kvnotes on a shared server.

    kvnotes users add NAME [--role editor|viewer] [--password-stdin]
    kvnotes users passwd NAME [--password-stdin]   (ends every session of that user)
    kvnotes users list
    kvnotes users remove NAME
    kvnotes tokens create NAME [--label TEXT]     (prints the token alone on stdout)
    kvnotes tokens list [NAME]
    kvnotes tokens revoke ID|TOKEN|NAME

Each command migrates the database first (it may be the first thing run on a new server) and
works on the database of `DATABASE_URL`. Hashing and checks live in `data.accounts`.
"""

from __future__ import annotations

import argparse
import getpass
import sys


class CommandError(Exception):
    """Bad input: one line on stderr, exit status 2."""


def _session():
    from data.db import get_sessionmaker
    from data.migrate import upgrade_to_head

    upgrade_to_head()
    return get_sessionmaker()()


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        line = sys.stdin.readline()
        return line[:-1] if line.endswith("\n") else line
    first = getpass.getpass(f"password for {args.name}: ")
    if getpass.getpass("again: ") != first:
        raise CommandError("the two passwords differ")
    return first


def _run(action):
    """Run `action(session)` and commit; an `AccountError` becomes a `CommandError`."""
    from data.accounts import AccountError

    with _session() as session:
        try:
            result = action(session)
        except AccountError as exc:
            raise CommandError(str(exc)) from None
        session.commit()
        return result


def cmd_users_add(args: argparse.Namespace) -> None:
    from data.accounts import add_user, check_name

    try:
        check_name(args.name)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    password = _password(args)
    _run(lambda s: add_user(s, args.name, password, args.role))
    print(f"kvnotes: user {args.name} added ({args.role})", file=sys.stderr)


def cmd_users_passwd(args: argparse.Namespace) -> None:
    from data.accounts import set_password

    password = _password(args)
    ended = _run(lambda s: set_password(s, args.name, password))
    print(f"kvnotes: password of {args.name} changed; {ended} session(s) signed out", file=sys.stderr)


def cmd_users_list(_args: argparse.Namespace) -> None:
    from data.accounts import list_users

    def rows(session):
        return [(u.name, u.role, len(u.tokens), u.created_at) for u in list_users(session)]

    for name, role, tokens, created in _run(rows):
        print(f"{name}\t{role}\t{tokens} tokens\tsince {created:%Y-%m-%d}")


def cmd_users_remove(args: argparse.Namespace) -> None:
    from data.accounts import remove_user

    _run(lambda s: remove_user(s, args.name))
    print(f"kvnotes: user {args.name} removed, with their tokens", file=sys.stderr)


def cmd_tokens_create(args: argparse.Namespace) -> None:
    from data.accounts import create_token

    row, token = _run(lambda s: create_token(s, args.name, args.label))
    print(token)
    print(f"kvnotes: token {row.id} for {args.name}; it is shown only now", file=sys.stderr)


def cmd_tokens_list(args: argparse.Namespace) -> None:
    from data.accounts import list_tokens

    def rows(session):
        return [(t.id, t.user.name, t.hint, t.label, t.created_at, t.last_used_at)
                for t in list_tokens(session, args.name)]

    for ident, name, hint, label, created, used in _run(rows):
        last = f"used {used:%Y-%m-%d %H:00}" if used else "never used"
        print(f"{ident}\t{name}\t{hint}…\t{label}\t{created:%Y-%m-%d}\t{last}")


def cmd_tokens_revoke(args: argparse.Namespace) -> None:
    from data.accounts import revoke_token

    count = _run(lambda s: revoke_token(s, args.which))
    print(f"kvnotes: {count} token(s) revoked", file=sys.stderr)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `users` and `tokens` on the `kvnotes` command line."""
    users = subparsers.add_parser("users", help="accounts for signing in (editor or viewer)")
    sub = users.add_subparsers(dest="users_command", required=True)
    p = sub.add_parser("add", help="add a user (asks for the password twice, or reads one line of stdin)")
    p.add_argument("name")
    p.add_argument("--role", choices=("editor", "viewer"), default="editor")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of stdin")
    p.set_defaults(func=cmd_users_add)
    p = sub.add_parser("passwd", help="change a user's password and sign out every session of theirs")
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of stdin")
    p.set_defaults(func=cmd_users_passwd)
    sub.add_parser("list", help="list users").set_defaults(func=cmd_users_list)
    p = sub.add_parser("remove", help="remove a user and their tokens")
    p.add_argument("name")
    p.set_defaults(func=cmd_users_remove)

    tokens = subparsers.add_parser("tokens", help="API tokens (Authorization: Bearer …)")
    sub = tokens.add_subparsers(dest="tokens_command", required=True)
    p = sub.add_parser("create", help="make a token for a user and print it (alone) on stdout")
    p.add_argument("name")
    p.add_argument("--label", default="", help="what the token is for")
    p.set_defaults(func=cmd_tokens_create)
    p = sub.add_parser("list", help="list tokens (never the tokens themselves)")
    p.add_argument("name", nargs="?", default=None)
    p.set_defaults(func=cmd_tokens_list)
    p = sub.add_parser("revoke", help="revoke a token by id, by the token itself, or all of a user's by name")
    p.add_argument("which")
    p.set_defaults(func=cmd_tokens_revoke)
