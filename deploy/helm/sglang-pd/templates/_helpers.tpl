{{/* Names, labels and shared fragments (server pools: _server.tpl; model: _model.tpl; router: _router.tpl). */}}

{{- define "sglang-pd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* RELEASE-sglang-pd, or the release name alone when it already holds the chart name. */}}
{{- define "sglang-pd.fullname" -}}
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

{{- define "sglang-pd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sglang-pd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sglang-pd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sglang-pd.labels" -}}
helm.sh/chart: {{ include "sglang-pd.chart" . }}
{{ include "sglang-pd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sglang-pd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "sglang-pd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sglang-pd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sglang-pd.image" -}}
{{- $img := .image | default dict }}
{{- $repo := $img.repository | default .root.Values.image.repository }}
{{- $tag := $img.tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- printf "%s:%s" $repo (toString $tag) }}
{{- end }}

{{/* Name of the Secret holding the API key; empty when no key is configured. */}}
{{- define "sglang-pd.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret }}
{{- .Values.apiKey.existingSecret }}
{{- else if .Values.apiKey.value }}
{{- printf "%s-api-key" (include "sglang-pd.fullname" .) }}
{{- end }}
{{- end }}

{{/* The env var that carries the key; args reference it as $(SGLANG_PD_API_KEY) so the key
     itself never appears in the manifest. */}}
{{- define "sglang-pd.apiKeyEnv" -}}
{{- $secret := include "sglang-pd.apiKeySecret" . }}
{{- if $secret }}
- name: SGLANG_PD_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.apiKey.secretKey }}
{{- end }}
{{- end }}

{{/* A number as the CLI expects it: whole YAML numbers (float64 in templates) without the
     exponent Go would print for 1000000, fractions as they are, strings unchanged. */}}
{{- define "sglang-pd.cliValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}
{{- int64 . }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/* Flags from a {camelCaseKey: value} dict: null values are skipped, true booleans become a
     bare flag, false ones nothing. Output: one JSON list, parsed back by the caller. */}}
{{- define "sglang-pd.flagList" -}}
{{- $out := list }}
{{- range $key := keys . | sortAlpha }}
{{- $v := get $ $key }}
{{- $flag := printf "--%s" (kebabcase $key) }}
{{- if kindIs "bool" $v }}
{{- if $v }}{{ $out = append $out $flag }}{{ end }}
{{- else if not (kindIs "invalid" $v) }}
{{- $out = append $out $flag }}
{{- $out = append $out (include "sglang-pd.cliValue" $v) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* base overlaid by over, key by key; a null in over keeps base's value. */}}
{{- define "sglang-pd.overlay" -}}
{{- $out := deepCopy (.base | default dict) }}
{{- range $k, $v := (.over | default dict) }}
{{- if not (kindIs "invalid" $v) }}{{ $_ := set $out $k $v }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}
