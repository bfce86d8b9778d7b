"""The SDK's models against the OpenAPI document the running binary serves: every field the SDK
reads or writes exists there with a compatible type, every field a typed schema has is in the
model, enumerations and error codes agree. Schemas the document describes only in prose are
checked against real answers instead. Any drift fails. The models are generated from the
committed document (``test_generated_models.py``); this holds them to the served one."""

from __future__ import annotations

import dataclasses
import datetime as dt
import typing
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest

from differently import Client, models
from differently._codec import Unset, hints, key_of, wire_fields
from differently.errors import KNOWN_CODES

from .conftest import Server, recording_http

NONE = type(None)

# Answer models and the schema each one reads. A path after ":" picks a nested schema.
ANSWERS: List[Tuple[type, str]] = [
    (models.Sandbox, "Sandbox"),
    (models.Resources, "Resources"),
    (models.ExecResult, "ExecResult"),
    (models.ExecExit, "ExecExit"),
    (models.FileInfo, "FileList:items"),
    (models.MadeDir, "Directory"),
    (models.Snapshot, "Snapshot"),
    (models.ExposedPort, "PortAnswer"),
    (models.PendingOperation, "PendingOperation"),
    (models.Org, "Org"),
    (models.Project, "Project"),
    (models.Key, "Key"),
    (models.CreatedKey, "CreatedKey"),
    (models.QuotaView, "QuotaView"),
    (models.Quota, "Quota"),
    (models.SandboxLimit, "Quota:maxSandbox"),
    (models.Policy, "Policy"),
    (models.Pool, "Pool"),
    (models.PoolHealth, "PoolHealth"),
    (models.PoolRecord, "PoolRecord"),
    (models.WarmClasses, "WarmClasses"),
    (models.WarmClassStatus, "WarmClasses:classes"),
    (models.StatusEvent, "StatusEvent"),
    (models.Health, "Health"),
    (models.Placement, "Placement"),
    (models.DryRun, "DryRun"),
    (models.PoolVerdict, "PoolVerdict"),
    (models.EffectivePolicy, "EffectivePolicy"),
    (models.AuditEvent, "AuditEvent"),
    (models.AuditProblem, "AuditProblem"),
    (models.Verification, "Verification"),
    (models.VerifiedSegment, "Verification:segments"),
    (models.Checkpoint, "Checkpoint"),
    (models.ChainHead, "Checkpoint:heads"),
    (models.CheckpointSegment, "Checkpoint:segment"),
    (models.AuditSegment, "AuditSegment"),
    (models.Secret, "Secret"),
    (models.TrustReport, "TrustReport"),
    (models.TrustPool, "TrustReport:pools"),
    (models.ExternalPlacement, "TrustReport:externalPlacements"),
    (models.MetricsSummary, "MetricsSummary"),
    (models.QueueReport, "QueueReport"),
    (models.QueueOrg, "QueueReport:orgs"),
    (models.PublicEvent, "PublicEvent"),
    (models.EventSchemaList, "EventSchemaList"),
    (models.EventTypeSchema, "EventSchemaList:items"),
    (models.EventCredentials, "EventCredentials"),
    (models.Webhook, "Webhook"),
    (models.WebhookWithSecret, "WebhookWithSecret"),
    (models.WebhookDelivery, "WebhookDelivery"),
]

# Request models and the schema of the body they become.
REQUESTS: List[Tuple[type, str]] = [
    (models.CreateSandboxRequest, "CreateSandboxRequest"),
    (models.ResourcesSpec, "CreateSandboxRequest:resources"),
    (models.UpdateSandboxRequest, "UpdateSandboxRequest"),
    (models.ExecRequest, "ExecRequest"),
    (models.SnapshotRequest, "SnapshotRequest"),
    (models.PortRequest, "PortRequest"),
    (models.MakeDirectoryRequest, "MakeDirectory"),
    (models.CreateOrgRequest, "CreateOrgRequest"),
    (models.UpdateOrgRequest, "UpdateOrgRequest"),
    (models.CreateProjectRequest, "CreateProjectRequest"),
    (models.UpdateProjectRequest, "UpdateProjectRequest"),
    (models.CreateKeyRequest, "CreateKeyRequest"),
    (models.Quota, "Quota"),
    (models.SandboxLimit, "Quota:maxSandbox"),
    (models.Policy, "Policy"),
    (models.PoolRequest, "PoolRequest"),
    (models.WarmClass, "WarmClassesRequest:classes"),
    (models.WarmResources, "WarmClass:resources"),
    (models.SecretRequest, "SecretRequest"),
    (models.AuditSegmentRequest, "AuditSegmentRequest"),
    (models.EventCredentialsRequest, "EventCredentialsRequest"),
    (models.CreateWebhookRequest, "CreateWebhookRequest"),
    (models.UpdateWebhookRequest, "UpdateWebhookRequest"),
]

# Answer models also checked against real answers of the running server (these were prose in
# the document until it typed them; a real answer catches a schema that says more than is sent).
LIVE = [
    "Placement", "DryRun", "AuditEvent", "Verification", "TrustReport", "Secret", "Checkpoint",
    "MetricsSummary", "QueueReport", "EventSchemaList", "PublicEvent", "Webhook", "WebhookWithSecret",
]  # fmt: skip


@pytest.fixture(scope="module")
def doc(server: Server) -> Dict[str, Any]:
    http = recording_http(server)
    with Client(server.url, server.admin_key, http_client=http) as c:
        served = c.openapi()
    http.close()
    assert served["openapi"].startswith("3.1")
    assert served == server.openapi, "client.openapi() returns the served document"
    return served


def _deref(doc: Dict[str, Any], schema: Dict[str, Any]) -> Dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _variants(doc: Dict[str, Any], schema: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], bool]:
    """The non-null alternatives of a schema, and whether null is allowed."""
    schema = _deref(doc, schema)
    union = schema.get("anyOf") or schema.get("oneOf")
    if union:
        out: List[Dict[str, Any]] = []
        nullable = False
        for alt in union:
            alts, n = _variants(doc, alt)
            out += alts
            nullable = nullable or n
        return out, nullable
    types = schema.get("type")
    if isinstance(types, list):
        nullable = "null" in types
        rest = [t for t in types if t != "null"]
        return ([{**schema, "type": rest[0] if len(rest) == 1 else rest}] if rest else []), nullable
    return [schema], types == "null"


def _schema(doc: Dict[str, Any], ref: str) -> Dict[str, Any]:
    name, _, sub = ref.partition(":")
    schema = _deref(doc, doc["components"]["schemas"][name])
    if sub:
        prop = schema["properties"][sub]
        if prop.get("type") == "array":
            prop = prop["items"]
        alts, _ = _variants(doc, prop)
        schema = _deref(doc, alts[0])
    return schema


def _strip(tp: Any) -> Tuple[Any, bool]:
    """A hint without None/UNSET, and whether it admits None."""
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not Unset]
        nullable = NONE in args
        rest = [a for a in args if a is not NONE]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), nullable
    return tp, False


def _compatible(doc: Dict[str, Any], tp: Any, schema: Dict[str, Any], where: str, errors: List[str], request: bool) -> None:
    tp, _ = _strip(tp)
    alts, _ = _variants(doc, schema)
    if tp is Any or not alts or all(not a.get("type") and "properties" not in a for a in alts):
        return
    s = alts[0]
    jtype = s.get("type")
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        values = {v for v in typing.get_args(tp)}
        # A union of enumerations (a pool's isolation) is one set of values.
        values_of = [a for a in alts if a.get("type") != "null"]
        enum = {v for a in values_of for v in a.get("enum", []) if v is not None}
        if any(a.get("type") != "string" for a in values_of) or not enum:
            errors.append(f"{where}: the SDK has an enumeration, the schema {s}")
        elif values != enum:
            errors.append(f"{where}: enumeration drift: SDK {sorted(values)} vs served {sorted(enum)}")
        return
    if origin in (list, List):
        if jtype != "array":
            errors.append(f"{where}: SDK list, schema {jtype}")
            return
        _compatible(doc, typing.get_args(tp)[0], s.get("items", {}), f"{where}[]", errors, request)
        return
    if origin in (dict, Dict):
        if jtype != "object":
            errors.append(f"{where}: SDK mapping, schema {jtype}")
            return
        key_tp = typing.get_args(tp)[0] if typing.get_args(tp) else str
        names = s.get("propertyNames", {}).get("enum")
        if typing.get_origin(key_tp) is typing.Literal or names:
            sdk_names = set(typing.get_args(key_tp)) if typing.get_origin(key_tp) is typing.Literal else None
            if sdk_names != set(names or []):
                errors.append(f"{where}: key enumeration drift: SDK {sdk_names} vs served {names}")
        extra = s.get("additionalProperties")
        if isinstance(extra, dict):
            _compatible(doc, typing.get_args(tp)[1], extra, f"{where}{{}}", errors, request)
        return
    if dataclasses.is_dataclass(tp):
        if jtype not in (None, "object"):
            errors.append(f"{where}: SDK object, schema {jtype}")
        else:
            _check_model(doc, tp, s, where, errors, request)
        return
    expected = {int: {"integer"}, float: {"number", "integer"}, str: {"string"}, bool: {"boolean"}, dt.datetime: {"string"}}
    want = expected.get(tp)
    if want is None:
        errors.append(f"{where}: the test does not know the SDK type {tp}")
    elif jtype not in want:
        errors.append(f"{where}: SDK {getattr(tp, '__name__', tp)}, schema {jtype}")
    elif tp is dt.datetime and s.get("format") != "date-time":
        errors.append(f"{where}: SDK datetime, schema format {s.get('format')}")


def _check_model(doc: Dict[str, Any], cls: Any, schema: Dict[str, Any], where: str, errors: List[str], request: bool) -> None:
    props: Dict[str, Any] = schema.get("properties", {})
    required: Set[str] = set(schema.get("required", []))
    h = hints(cls)
    keys = set()
    for f in wire_fields(cls):
        key = key_of(f)
        keys.add(key)
        at = f"{where}.{key}"
        if key not in props:
            errors.append(f"{at}: the SDK {'writes' if request else 'reads'} a field the schema lacks")
            continue
        _, sdk_nullable = _strip(h[f.name])
        _, schema_nullable = _variants(doc, props[key])
        if request:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if key in required and has_default:
                errors.append(f"{at}: required by the schema, optional in the SDK")
            if sdk_nullable and not schema_nullable and not getattr(cls, "_omit_none", False):
                errors.append(f"{at}: the SDK may send null, the schema refuses it")
        else:
            if not sdk_nullable and (key not in required or schema_nullable):
                errors.append(f"{at}: the SDK needs a value, the schema allows none/null")
        _compatible(doc, h[f.name], props[key], at, errors, request)
    if not request:
        missing = set(props) - keys
        if missing:
            errors.append(f"{where}: served fields the SDK model lacks: {sorted(missing)}")
    elif schema.get("additionalProperties") is False:
        pass  # the SDK writing only known fields was checked above


def test_answer_models_match_the_served_schemas(doc: Dict[str, Any]) -> None:
    errors: List[str] = []
    for cls, ref in ANSWERS:
        _check_model(doc, cls, _schema(doc, ref), cls.__name__, errors, request=False)
    assert not errors, "\n".join(errors)


def test_request_models_match_the_served_schemas(doc: Dict[str, Any]) -> None:
    errors: List[str] = []
    for cls, ref in REQUESTS:
        _check_model(doc, cls, _schema(doc, ref), cls.__name__, errors, request=True)
    assert not errors, "\n".join(errors)


def test_error_codes_match(doc: Dict[str, Any]) -> None:
    served = set(doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"])
    assert served == set(KNOWN_CODES), f"served {sorted(served ^ set(KNOWN_CODES))} differ"
    stream = set(doc["components"]["schemas"]["StreamError"]["properties"]["code"]["enum"])
    assert stream <= set(KNOWN_CODES)


def test_every_answer_schema_is_typed(doc: Dict[str, Any]) -> None:
    # A schema given only in prose ({"type": "object", "description": …}) checks nothing.
    untyped = [ref for _, ref in ANSWERS if not _schema(doc, ref).get("properties")]
    assert not untyped, f"schemas without properties: {untyped}"
    names = {cls.__name__ for cls, _ in ANSWERS}
    assert set(LIVE) <= names


def _check_live(cls: Any, body: Dict[str, Any], where: str, errors: List[str]) -> None:
    h = hints(cls)
    for f in wire_fields(cls):
        key = key_of(f)
        tp, nullable = _strip(h[f.name])
        if key not in body:
            if not nullable:
                errors.append(f"{where}.{key}: not in a real answer")
            continue
        value = body[key]
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            _check_live(tp, value, f"{where}.{key}", errors)
        if typing.get_origin(tp) in (list, List) and isinstance(value, list):
            (item,) = typing.get_args(tp)
            if dataclasses.is_dataclass(item):
                for v in value:
                    _check_live(item, v, f"{where}.{key}[]", errors)


def test_typed_models_match_real_answers(client: Client, sandbox: Any, tag: str) -> None:
    client.secrets.put(f"drift-{tag}", "v")
    client.sandboxes.exec(sandbox, ["true"])  # something new for the checkpoint to sign
    checkpoint = client.audit.checkpoint()
    assert checkpoint is not None
    hook = client.webhooks.create("http://127.0.0.1:9/drift", description="drift")
    samples = {
        "Placement": client.sandboxes.placement(sandbox).raw,
        "DryRun": client.placement.dry_run().raw,
        "AuditEvent": next(iter(client.audit.list(resource=sandbox.id))).raw,
        "Verification": client.audit.verify().raw,
        "TrustReport": client.trust_report().raw,
        "Secret": next(iter(client.secrets.list())).raw,
        "Checkpoint": checkpoint.raw,
        "MetricsSummary": client.metrics_summary().raw,
        "QueueReport": client.queue().raw,
        "EventSchemaList": client.events.schemas().raw,
        "PublicEvent": next(iter(client.events.stream(sandbox_id=sandbox.id, after=0, format="public"))).raw,
        "WebhookWithSecret": hook.raw,
        "Webhook": client.webhooks.get(hook).raw,
    }
    client.webhooks.delete(hook)
    errors: List[str] = []
    for name in LIVE:
        _check_live(getattr(models, name), samples[name], name, errors)
    assert not errors, "\n".join(errors)
