"""Who may do what, and the browser protections: the principal of a request (`principal`), signed
cookies (`cookies`), the authorization gate every route runs (`guard`) and the ASGI middleware for
the Host allowlist, cross-site request refusal and security headers (`middleware`)."""
