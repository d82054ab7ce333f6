"""A private sigstore in a box, for toolguard's keyless-signature tests.

Usage: keyless.py OUT_DIR PAYLOAD_FILE ISSUER SUBJECT [FLAW]
       keyless.py OUT_DIR bundle:sha256:HEX ISSUER SUBJECT [FLAW]

Plays Fulcio and Rekor as a private deployment would: a root CA and an
intermediate (P-384) issue a short-lived code-signing certificate (P-256)
for SUBJECT (an email, or a URI for a workflow identity) with ISSUER in
Fulcio's OIDC-issuer extensions (1.3.6.1.4.1.57264.1.1 and .1.8); the
certificate's key signs the payload; a "Rekor" key signs the entry's
Signed Entry Timestamp over the canonical JSON cosign verifies.

Writes OUT_DIR/trusted_root.json (sigstore's trusted-root format, naming
the CA chain and the log key) and prints, as one JSON object, the
annotations of a cosign keyless signature layer (signature, certificate,
chain, bundle).

With `bundle:DIGEST` it signs as cosign 3 does by default instead: a
sigstore bundle (v0.3 JSON) holding a DSSE envelope around an in-toto
statement naming DIGEST with cosign's signing predicate, printed as
{"bundle": "<json>"}.

FLAW makes one thing wrong, for the refusal tests: `other-ca` (the chain
is a CA the trusted root does not name), `expired` (the log integrated it
after the certificate expired), `forged-set` (the timestamp signed by
another key), `other-payload` (the log entry names other bytes).
"""

import base64
import datetime
import hashlib
import json
import os
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

ISSUER_V1 = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
ISSUER_V2 = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")


def name(cn):
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "toolguard-test"), x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def ca(cn, key, issuer_name, issuer_key, start, path_length):
    # As Fulcio's: the intermediate (path length 0) is for code signing only.
    builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start)
               .not_valid_after(start + datetime.timedelta(days=3650))
               .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
               .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if path_length == 0:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    return builder.sign(issuer_key, hashes.SHA384())


def der_utf8(text):
    raw = text.encode()
    assert len(raw) < 128
    return bytes([0x0C, len(raw)]) + raw


def b64(data):
    return base64.b64encode(data).decode()


def main():
    out, payload_file, issuer, subject = sys.argv[1:5]
    flaw = sys.argv[5] if len(sys.argv) > 5 else ""
    subject_digest = payload_file[len("bundle:"):] if payload_file.startswith("bundle:") else None
    if subject_digest:
        statement = {"_type": "https://in-toto.io/Statement/v1",
                     "subject": [{"digest": {"sha256": subject_digest.split(":", 1)[1]}}],
                     "predicateType": "https://sigstore.dev/cosign/sign/v1", "predicate": {}}
        payload = json.dumps(statement, separators=(",", ":")).encode()
    else:
        payload = open(payload_file, "rb").read()
    payload_type = "application/vnd.in-toto+json"
    # What the signature is over: the payload, or for DSSE its pre-authentication encoding.
    message = (b"DSSEv1 %d %s %d " % (len(payload_type), payload_type.encode(), len(payload)) + payload) if subject_digest else payload
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    start = now - datetime.timedelta(days=1)

    root_key, inter_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    root = ca("test-fulcio-root", root_key, name("test-fulcio-root"), root_key, start, 1)
    inter = ca("test-fulcio-intermediate", inter_key, root.subject, root_key, start, 0)
    signing_ca, signing_key = inter, inter_key
    if flaw == "other-ca":
        rogue_key = ec.generate_private_key(ec.SECP384R1())
        signing_ca = ca("rogue-intermediate", rogue_key, name("rogue-root"), rogue_key, start, 0)
        signing_key = rogue_key

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    issued = now - datetime.timedelta(minutes=20) if flaw == "expired" else now - datetime.timedelta(minutes=1)
    san = x509.RFC822Name(subject) if "@" in subject and "://" not in subject else x509.UniformResourceIdentifier(subject)
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(signing_ca.subject).public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(issued)
            .not_valid_after(issued + datetime.timedelta(minutes=10))
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([san]), critical=True)
            .add_extension(x509.UnrecognizedExtension(ISSUER_V1, issuer.encode()), critical=False)
            .add_extension(x509.UnrecognizedExtension(ISSUER_V2, der_utf8(issuer)), critical=False)
            .sign(signing_key, hashes.SHA384()))
    leaf_pem = leaf.public_bytes(serialization.Encoding.PEM)
    signature = leaf_key.sign(message, ec.ECDSA(hashes.SHA256()))

    logged = b"other bytes" if flaw == "other-payload" else payload
    if subject_digest:
        body = {"apiVersion": "0.0.1", "kind": "dsse", "spec": {
            "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(logged).hexdigest()},
            "signatures": [{"signature": b64(signature), "verifier": b64(leaf_pem)}]}}
    else:
        body = {"apiVersion": "0.0.1", "kind": "hashedrekord", "spec": {
            "data": {"hash": {"algorithm": "sha256", "value": hashlib.sha256(logged).hexdigest()}},
            "signature": {"content": b64(signature), "publicKey": {"content": b64(leaf_pem)}}}}
    rekor_key = ec.generate_private_key(ec.SECP256R1())
    rekor_spki = rekor_key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    log_id = hashlib.sha256(rekor_spki).hexdigest()
    integrated = int((now if flaw != "expired" else now).timestamp())
    entry = {"body": b64(json.dumps(body, separators=(",", ":")).encode()), "integratedTime": integrated, "logID": log_id, "logIndex": 42}
    canonical = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    set_key = ec.generate_private_key(ec.SECP256R1()) if flaw == "forged-set" else rekor_key
    bundle = {"SignedEntryTimestamp": b64(set_key.sign(canonical, ec.ECDSA(hashes.SHA256()))), "Payload": entry}

    der = lambda c: b64(c.public_bytes(serialization.Encoding.DER))
    since = {"start": start.strftime("%Y-%m-%dT%H:%M:%SZ")}
    trusted_root = {
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": [{"baseUrl": "https://rekor.test", "hashAlgorithm": "SHA2_256",
                   "publicKey": {"rawBytes": b64(rekor_spki), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": since},
                   "logId": {"keyId": b64(bytes.fromhex(log_id))}}],
        "certificateAuthorities": [{"subject": {"organization": "toolguard-test", "commonName": "test-fulcio"}, "uri": "https://fulcio.test",
                                    "certChain": {"certificates": [{"rawBytes": der(inter)}, {"rawBytes": der(root)}]}, "validFor": since}],
        "ctlogs": [], "timestampAuthorities": [],
    }
    with open(os.path.join(out, "trusted_root.json"), "w") as f:
        json.dump(trusted_root, f, indent=1)
    if subject_digest:
        entry_out = {"logIndex": str(entry["logIndex"]), "logId": {"keyId": b64(bytes.fromhex(log_id))},
                     "kindVersion": {"kind": "dsse", "version": "0.0.1"}, "integratedTime": str(integrated),
                     "inclusionPromise": {"signedEntryTimestamp": bundle["SignedEntryTimestamp"]}, "canonicalizedBody": entry["body"]}
        sigstore_bundle = {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                           "verificationMaterial": {"certificate": {"rawBytes": der(leaf)}, "tlogEntries": [entry_out]},
                           "dsseEnvelope": {"payload": b64(payload), "payloadType": payload_type, "signatures": [{"sig": b64(signature)}]}}
        print(json.dumps({"bundle": json.dumps(sigstore_bundle)}))
        return
    chain = signing_ca.public_bytes(serialization.Encoding.PEM) + (b"" if flaw == "other-ca" else root.public_bytes(serialization.Encoding.PEM))
    print(json.dumps({
        "dev.cosignproject.cosign/signature": b64(signature),
        "dev.sigstore.cosign/certificate": leaf_pem.decode(),
        "dev.sigstore.cosign/chain": chain.decode(),
        "dev.sigstore.cosign/bundle": json.dumps(bundle),
    }))


main()
