{{/* Chart name, truncated to the 63 characters Kubernetes allows in a name. */}}
{{- define "embedder.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name used for every object. */}}
{{- define "embedder.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "embedder.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Every pod of the release: what the NetworkPolicy selects. */}}
{{- define "embedder.releaseLabels" -}}
app.kubernetes.io/name: {{ include "embedder.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The serving pods only (Service, PDB, Deployment): hook pods (gate, helm test) must never get traffic. */}}
{{- define "embedder.selectorLabels" -}}
{{ include "embedder.releaseLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "embedder.labels" -}}
helm.sh/chart: {{ include "embedder.chart" . }}
{{ include "embedder.releaseLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "embedder.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "embedder.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The gate Job's ServiceAccount: a hook of its own (gate-serviceaccount.yaml) when the chart creates ServiceAccounts,
since the chart's ServiceAccount does not exist yet when pre-install hooks run; else the one you manage.
*/}}
{{- define "embedder.gateServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- printf "%s-gate" (include "embedder.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given (immutable). */}}
{{- define "embedder.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end }}
{{- end }}

{{- define "embedder.secretName" -}}
{{- default (printf "%s-auth" (include "embedder.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/*
EMBED_ADMIN_API_KEYS of the chart's Secret. /adapt is never rendered open: auth.adminApiKeys when given; else, while
config.adapt_enabled, the key this release generated before (read back from its Secret, so an upgrade keeps it) or,
on install, a new random one. `helm template` cannot read the cluster (lookup returns nothing): it renders a new key.
*/}}
{{- define "embedder.adminApiKeys" -}}
{{- if .Values.auth.adminApiKeys }}
{{- join "," .Values.auth.adminApiKeys }}
{{- else if .Values.config.adapt_enabled }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "embedder.secretName" .) }}
{{- $kept := "" }}
{{- if $secret }}
{{- $kept = get ($secret.data | default dict) "EMBED_ADMIN_API_KEYS" | b64dec }}
{{- end }}
{{- $kept | default (randAlphaNum 40) }}
{{- end }}
{{- end }}

{{- define "embedder.claimName" -}}
{{- default (printf "%s-registry" (include "embedder.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/*
A settings value as the environment variable text ServiceSettings parses: lists comma-separated, maps as
JSON, whole numbers without an exponent (YAML numbers arrive as float64, and 52428800 would print as
5.24288e+07, which an int field rejects).
*/}}
{{- define "embedder.envValue" -}}
{{- $v := . }}
{{- if kindIs "slice" $v }}
{{- join "," $v }}
{{- else if kindIs "map" $v }}
{{- toJson $v }}
{{- else if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) }}
{{- int64 $v }}
{{- else }}
{{- toString $v }}
{{- end }}
{{- end }}

{{/* The container securityContext every container of the chart uses. */}}
{{- define "embedder.securityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}

{{/* The writable scratch every pod of the chart mounts at /tmp (the root filesystem is read-only). */}}
{{- define "embedder.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- end }}

{{/*
Shell script of the seed-registry init container: copy each bundle built into the image into the shared
registry when no model of that name is there yet. Copies to a private name first and renames it into
place (mv -T refuses to land inside an existing folder), so replicas starting together never see a half
copy and never overwrite a model that adapt jobs or a newer release published.
*/}}
{{- define "embedder.seedScript" -}}
set -eu
seed={{ .Values.seedRegistry.path | quote }}
registry={{ .Values.config.registry_dir | quote }}
mkdir -p "$registry"
for src in "$seed"/*/; do
  [ -d "$src" ] || continue
  name=$(basename "$src")
  if [ -e "$registry/$name" ]; then
    echo "seed-registry: $name already in $registry"
    continue
  fi
  tmp="$registry/.seed-$name-$(hostname)"
  rm -rf "$tmp"
  cp -R "$src" "$tmp"
  if mv -T "$tmp" "$registry/$name" 2>/dev/null; then
    echo "seed-registry: copied $name into $registry"
  else
    rm -rf "$tmp"
    echo "seed-registry: another replica seeded $name first"
  fi
done
{{- end }}
