"""attune's notify actions (core.notify_webhook, core.notify_slack, core.notify_email): one
message to one receiver, its parameters as JSON on stdin, the result as JSON on the last line of
stdout.

A failure the receiver may get over (it cannot be reached, it answers 408, 429 or 5xx, the mail
server refuses for now) exits 75, which attune retries with the action's backoff; any other
refusal (a 4xx, a mail server's 5xx) exits 1 and is not retried. Every attempt of one
notification carries the same delivery id (X-Attune-Delivery, the chain's idempotency key unless
the rule gives one), so a receiver that saw it once can tell a resend.

A webhook with a signing key is signed as Stripe signs: X-Attune-Signature: t=TIME,v1=HEX, the
HMAC-SHA256 of "TIME.BODY" under the key.
"""
import hashlib
import hmac
import json
import os
import sys
import time

TRANSIENT = 75


def fail(message, transient):
    print(message, file=sys.stderr)
    sys.exit(TRANSIENT if transient else 1)


def delivery_id(params):
    return str(params.get("delivery") or os.environ.get("ATTUNE_IDEMPOTENCY_KEY") or os.environ.get("ATTUNE_EXECUTION_ID", ""))


def post(url, body, headers, timeout):
    # (imported here: an e-mail needs none of it, and each import is time before the send)
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as e:
        transient = e.code in (408, 429) or e.code >= 500
        fail(f"{url.split('?')[0]} answered {e.code}", transient)
    except (urllib.error.URLError, OSError) as e:
        fail(f"{url.split('?')[0]} could not be reached: {getattr(e, 'reason', e)}", True)


def webhook(params):
    body = json.dumps(params.get("body", {}), separators=(",", ":"), sort_keys=True).encode()
    delivery = delivery_id(params)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "attune-notify",
        "X-Attune-Delivery": delivery,
        "Idempotency-Key": delivery,
    }
    key = params.get("signing_key")
    if key:
        at = str(int(time.time()))
        tag = hmac.new(key.encode(), at.encode() + b"." + body, hashlib.sha256).hexdigest()
        headers["X-Attune-Signature"] = f"t={at},v1={tag}"
    status = post(params["url"], body, headers, params.get("timeout_secs", 10))
    return {"status": status, "delivery": delivery, "signed": bool(key)}


def slack(params):
    message = {"text": params["text"]}
    for field in ("channel", "username", "icon_emoji"):
        if params.get(field):
            message[field] = params[field]
    body = json.dumps(message).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "attune-notify"}
    status = post(params["url"], body, headers, params.get("timeout_secs", 10))
    return {"status": status}


def email(params):
    import smtplib
    import ssl
    from email.message import EmailMessage

    message = EmailMessage()
    message["From"] = params["sender"]
    recipients = params["to"] if isinstance(params["to"], list) else [params["to"]]
    message["To"] = ", ".join(recipients)
    message["Subject"] = params["subject"]
    message["Message-ID"] = f"<{delivery_id(params)}@attune>"
    message.set_content(params.get("text", ""))
    host, port = params["smtp_host"], params.get("smtp_port", 587)
    timeout = params.get("timeout_secs", 10)
    try:
        with smtplib.SMTP(host, port, timeout=timeout) as smtp:
            if params.get("starttls", True):
                smtp.starttls(context=ssl.create_default_context())
            if params.get("username"):
                smtp.login(params["username"], params.get("password", ""))
            refused = smtp.send_message(message)
    except smtplib.SMTPResponseException as e:
        fail(f"{host}:{port} refused the message: {e.smtp_code}", 400 <= e.smtp_code < 500)
    except (smtplib.SMTPException, OSError) as e:
        fail(f"{host}:{port} could not take the message: {e}", True)
    return {"sent_to": [r for r in recipients if r not in refused], "refused": sorted(refused)}


KINDS = {"core.notify_webhook": webhook, "core.notify_slack": slack, "core.notify_email": email}

if __name__ == "__main__":
    params = json.load(sys.stdin)
    action = os.environ.get("ATTUNE_ACTION_REF", "core.notify_webhook")
    if action not in KINDS:
        fail(f"notify.py does not know the action {action}", False)
    print(json.dumps(KINDS[action](params)))
