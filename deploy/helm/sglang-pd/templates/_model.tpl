{{/* Transfer environment and the model volume (claim, mount, init container). */}}

{{/* NIXL/UCX and disaggregation timeouts; unset values are left to the server's defaults. */}}
{{- define "sglang-pd.transferEnv" -}}
{{- $t := .Values.transfer }}
{{- $env := dict "SGLANG_DISAGGREGATION_NIXL_BACKEND" $t.nixlBackend "UCX_NET_DEVICES" $t.ucxNetDevices "NIXL_LOG_LEVEL" $t.nixlLogLevel "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" $t.bootstrapTimeoutSeconds "SGLANG_DISAGGREGATION_WAITING_TIMEOUT" $t.waitingTimeoutSeconds "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL" $t.heartbeatIntervalSeconds "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE" $t.heartbeatMaxFailure }}
{{- range $name := keys $env | sortAlpha }}
{{- $value := get $env $name }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ $name }}
  value: {{ include "sglang-pd.cliValue" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sglang-pd.modelClaimName" -}}
{{- .Values.model.pvc.existingClaim | default (printf "%s-model" (include "sglang-pd.fullname" .)) }}
{{- end }}

{{- define "sglang-pd.modelVolume" -}}
{{- $m := .Values.model }}
{{- if eq $m.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ include "sglang-pd.modelClaimName" . }}
{{- else if eq $m.source "hostPath" }}
- name: model
  hostPath:
    path: {{ $m.hostPath.path }}
    type: Directory
{{- else if eq $m.source "emptyDir" }}
- name: model
  emptyDir:
    {{- with $m.emptyDir.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- end }}
{{- end }}

{{/* Servers only read the model; the init container is the one writer. */}}
{{- define "sglang-pd.modelVolumeMount" -}}
{{- if ne .Values.model.source "none" }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Fills the model volume: writes into a scratch directory and renames it into place when
     the command succeeds, so a crashed or concurrent download never leaves a half model. */}}
{{- define "sglang-pd.modelInitContainers" -}}
{{- $m := .Values.model }}
{{- if and $m.init.enabled (ne $m.source "none") }}
initContainers:
  - name: model-init
    image: {{ $m.init.image | default (include "sglang-pd.image" (dict "root" .)) }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["sh", "-c"]
    args:
      - |
        set -eu
        final="$MODEL_DIR"
        if [ "$SKIP_IF_COMPLETE" = "true" ] && [ -f "$final/.complete" ]; then
          echo "model already in $final"; exit 0
        fi
        scratch="$final.partial.$POD_NAME"
        rm -rf "$scratch"; mkdir -p "$scratch"
        MODEL_DIR="$scratch" "$@"
        touch "$scratch/.complete"
        if [ -f "$final/.complete" ]; then
          echo "another pod filled $final first"; rm -rf "$scratch"; exit 0
        fi
        rm -rf "$final"
        mv "$scratch" "$final"
      - model-init
      {{- range $m.init.command }}
      - {{ . | quote }}
      {{- end }}
    env:
      - name: MODEL_DIR
        value: {{ $m.path | quote }}
      - name: SKIP_IF_COMPLETE
        value: {{ $m.init.skipIfComplete | quote }}
      - name: POD_NAME
        valueFrom:
          fieldRef:
            fieldPath: metadata.name
      {{- with $m.init.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- with $m.init.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    securityContext:
      {{- toYaml .Values.server.securityContext | nindent 6 }}
    volumeMounts:
      - name: model
        mountPath: {{ $m.mountPath }}
      - name: tmp
        mountPath: /tmp
{{- end }}
{{- end }}
