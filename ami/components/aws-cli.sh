#!/usr/bin/env bash
# AWS CLI v2 at SCALETRAIN_AWS_CLI (/usr/local/bin/aws): the nodes stage data from s3:// with `aws s3 cp`. Installed
# from AWS's installer for the pinned version, awscli-exe-linux-x86_64-<version>.zip, whose detached PGP signature
# must verify against the AWS CLI Team key (fingerprint FB5D B77F D5C1 18B8 0511 ADA8 A631 0ACC 4672 475C), copied
# below from the AWS CLI User Guide, "Installing or updating to the latest version of the AWS CLI", Linux, "(Optional)
# Verifying the integrity of your downloaded zip file" and "Installing past releases of the AWS CLI version 2"
# (https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html,
# https://docs.aws.amazon.com/cli/latest/userguide/getting-started-version.html).
# Reads: AWS_CLI_VERSION; SCALETRAIN_AWS_CLI (ami/paths.py).
set -euo pipefail
: "${AWS_CLI_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_AWS_CLI:?set by the Image Builder component from ami/paths.py}"
INSTALLER="https://awscli.amazonaws.com/awscli-exe-linux-x86_64-${AWS_CLI_VERSION}.zip"
INSTALL_DIR=/usr/local/aws-cli   # the installer's default --install-dir
KEY_FINGERPRINT=FB5DB77FD5C118B80511ADA8A6310ACC4672475C
read -r -d '' AWS_CLI_KEY <<'KEY' || true
-----BEGIN PGP PUBLIC KEY BLOCK-----

mQINBF2Cr7UBEADJZHcgusOJl7ENSyumXh85z0TRV0xJorM2B/JL0kHOyigQluUG
ZMLhENaG0bYatdrKP+3H91lvK050pXwnO/R7fB/FSTouki4ciIx5OuLlnJZIxSzx
PqGl0mkxImLNbGWoi6Lto0LYxqHN2iQtzlwTVmq9733zd3XfcXrZ3+LblHAgEt5G
TfNxEKJ8soPLyWmwDH6HWCnjZ/aIQRBTIQ05uVeEoYxSh6wOai7ss/KveoSNBbYz
gbdzoqI2Y8cgH2nbfgp3DSasaLZEdCSsIsK1u05CinE7k2qZ7KgKAUIcT/cR/grk
C6VwsnDU0OUCideXcQ8WeHutqvgZH1JgKDbznoIzeQHJD238GEu+eKhRHcz8/jeG
94zkcgJOz3KbZGYMiTh277Fvj9zzvZsbMBCedV1BTg3TqgvdX4bdkhf5cH+7NtWO
lrFj6UwAsGukBTAOxC0l/dnSmZhJ7Z1KmEWilro/gOrjtOxqRQutlIqG22TaqoPG
fYVN+en3Zwbt97kcgZDwqbuykNt64oZWc4XKCa3mprEGC3IbJTBFqglXmZ7l9ywG
EEUJYOlb2XrSuPWml39beWdKM8kzr1OjnlOm6+lpTRCBfo0wa9F8YZRhHPAkwKkX
XDeOGpWRj4ohOx0d2GWkyV5xyN14p2tQOCdOODmz80yUTgRpPVQUtOEhXQARAQAB
tCFBV1MgQ0xJIFRlYW0gPGF3cy1jbGlAYW1hem9uLmNvbT6JAlQEEwEIAD4CGwMF
CwkIBwIGFQoJCAsCBBYCAwECHgECF4AWIQT7Xbd/1cEYuAURraimMQrMRnJHXAUC
akV0ygUJDqP4lQAKCRCmMQrMRnJHXFHjD/9eyZLYcKuQOlLvtqSDtUBiEZf6ZZjM
i3ygYH8rJNtuToUH+HvSpe819urJCquXhDrlK6N+aqW0hCLtNABJG/vsafIgvIYJ
hSGgpgtNnQyMV1jViRWqPjbouw8OkYKBThUfT1i2Y+wn58ifs6ODBCmTexWtXspA
Si+Gt49xDOW0APmbOPnI+a4HJW6tVEo6MWS0WjzpiBayR3d1A4pt4YrPfSdDgpLo
h2SLQqlRqvvVZJaWBjhkErNFpfsBA06sDcPEOb0G8LBUbR4WOcdvhe5LubJbZuxC
AG9kNPCVeQP1ixwjgjXKysaxeQ6rv0VzIQgRp6tLVLWhy6AKDNvLjFSsmXZ1Wl08
Y/RlOHXlzLuQMRE6sR1wOdRxc9TsrNWTGiBK65cvSWOy03JeBkQQ8pesqltiyxI9
U21kkgiXtTSKNGfKK8pO27D81YANhRqPK7iTp6kuFiY2WtOg90KTMNlIT+Ff85Y2
b1rHj6Z0SrCkJujhWk3IBPic/wJgz01LEc/OAdUPlby90RJZcIBhSlWhT7mXnXIO
c0HWlNQrns2s3CTyYwZSiSlYe9ApeLwhjDo8NhbFuCAy61l6O5UsR4AfZxx/rGKv
2wFb1/RN/P4gNe6vmxZAPjR0AQcwD3tc2McimOLr/22kmPz8IH3I0X7WoSFr0Biz
E91G7bb0hOb/cA==
=knv7
-----END PGP PUBLIC KEY BLOCK-----
KEY

# Rehearsal nodes (launcher/plans/rehearsal.py) build from package registries only, and awscli.amazonaws.com is not
# one: there the AWS CLI comes from PyPI (version 1, the same `aws s3` commands and options the launcher runs),
# installed at the same path.
EXPECTED="aws-cli/$AWS_CLI_VERSION "
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then EXPECTED="aws-cli/1."; fi

verify() {
    local have
    have=$("$SCALETRAIN_AWS_CLI" --version 2>&1) \
        || { echo "error: $SCALETRAIN_AWS_CLI does not run" >&2; return 1; }
    # `aws --version` prints "aws-cli/<version> Python/... Linux/... exe/x86_64...".
    case "$have" in
        "$EXPECTED"*) ;;
        *) echo "error: $SCALETRAIN_AWS_CLI is '$have', expected ${EXPECTED% }" >&2; return 1 ;;
    esac
}

# A rehearsal node's account is a stand-in reached through the CLI's own endpoint setting (endpoint_url), written
# by the local cluster to this one file (launcher/plans/rehearsal.py, AWS_CONFIG). Every user of the node reads it:
# root's boot, and slurmctld's epilog, which runs as SlurmUser with no HOME and no environment of its own.
REHEARSAL_CONFIG=/etc/scaletrain/rehearsal-aws-config

install_rehearsal() {
    python3 -m venv "$INSTALL_DIR"
    "$INSTALL_DIR/bin/python" -m pip install --quiet "awscli>=1.36,<2"
    rm -f "$SCALETRAIN_AWS_CLI"
    cat > "$SCALETRAIN_AWS_CLI" <<WRAPPER
#!/bin/sh
if [ -z "\${AWS_CONFIG_FILE:-}" ] && [ -r $REHEARSAL_CONFIG ]; then export AWS_CONFIG_FILE=$REHEARSAL_CONFIG; fi
exec $INSTALL_DIR/bin/aws "\$@"
WRAPPER
    chmod 0755 "$SCALETRAIN_AWS_CLI"
}

install_() {
    local work signer
    if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then install_rehearsal; return; fi
    work=$(mktemp -d)
    curl -fsSL -o "$work/awscliv2.zip" "$INSTALLER"
    curl -fsSL -o "$work/awscliv2.sig" "$INSTALLER.sig"
    # A keyring of this one key, so nothing else the build host trusts can vouch for the installer.
    export GNUPGHOME="$work/gnupg"
    install -d -m 0700 "$GNUPGHOME"
    gpg --batch --quiet --import <<<"$AWS_CLI_KEY"
    signer=$(gpg --batch --status-fd 1 --verify "$work/awscliv2.sig" "$work/awscliv2.zip" 2>/dev/null \
             | awk '$2 == "VALIDSIG" {print $NF}') || true
    if [ "$signer" != "$KEY_FINGERPRINT" ]; then
        echo "error: $INSTALLER is not signed by the AWS CLI Team key $KEY_FINGERPRINT" >&2
        rm -rf "$work"
        return 1
    fi
    unzip -q "$work/awscliv2.zip" -d "$work"
    "$work/aws/install" --update --install-dir "$INSTALL_DIR" --bin-dir "$(dirname "$SCALETRAIN_AWS_CLI")"
    rm -rf "$work"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
