"""The erratum gateway's web side: the OpenAI routes (`routes`) and the app `kvnotes gateway` serves
alone (`main`). The rewrite itself is `serving.gateway`; this process's gateway is
`app.services.gateway.current()`."""
