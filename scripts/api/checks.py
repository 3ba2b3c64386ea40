"""lmhost's own schemathesis check, loaded by scripts/check-api through SCHEMATHESIS_HOOKS:
every client error says what was wrong, so a user can fix the request without reading code."""

import json

import schemathesis


@schemathesis.check
def error_names_the_field(ctx, response, case):
    """A 4xx carries an OpenAI error with a message; a 400 or 413 names the field at fault in
    `param`, a 401 says the key is invalid."""
    status = response.status_code
    if status < 400 or status >= 500:
        return None
    try:
        error = json.loads(response.text)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"a {status} without an OpenAI error body: {response.text!r}")
    assert error.get("message"), f"a {status} without an error message: {error}"
    if status == 401:
        assert error.get("code") == "invalid_api_key", f"a 401 that is not about the key: {error}"
    if status in (400, 413):
        assert error.get("param"), f"a {status} that names no field: {error['message']}"
    return None
