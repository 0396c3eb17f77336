{{/* Server pools: effective settings per pool and the server command line. */}}

{{/* Every enabled server pool with its effective settings (server defaults overlaid by the
     pool's own keys), as a JSON list sorted by kind then name. */}}
{{- define "sglang-pd.pools" -}}
{{- $root := . }}
{{- $srv := .Values.server }}
{{- $fullname := include "sglang-pd.fullname" . }}
{{- $pools := list }}
{{- range $kind := list "prefill" "decode" }}
{{- $byName := (get $root.Values $kind).pools | default dict }}
{{- range $name := keys $byName | sortAlpha }}
{{- $p := get $byName $name | default dict }}
{{- if ne (toString $p.enabled) "false" }}
{{- $eff := dict "kind" $kind "name" $name "replicas" (hasKey $p "replicas" | ternary $p.replicas 1) }}
{{- $_ := set $eff "fullname" (printf "%s-%s-%s" ($fullname | trunc 36 | trimSuffix "-") $kind $name | trunc 52 | trimSuffix "-") }}
{{- $role := "" }}
{{- if and (eq $kind "prefill") $p.role }}{{ $role = $p.role }}{{ end }}
{{- $_ := set $eff "role" $role }}
{{- range $key := list "gpus" "gpuResourceName" "resources" "nodeSelector" "tolerations" "affinity" "antiAffinity" "topologySpreadConstraints" "priorityClassName" "podDisruptionBudget" "shm" }}
{{- $_ := set $eff $key (and (hasKey $p $key) (not (kindIs "invalid" (get $p $key))) | ternary (get $p $key) (get $srv $key)) }}
{{- end }}
{{- range $key := list "engine" "scheduling" "slo" "podAnnotations" "podLabels" }}
{{- $_ := set $eff $key (include "sglang-pd.overlay" (dict "base" (get $srv $key) "over" (get $p $key)) | fromJson) }}
{{- end }}
{{- $_ := set $eff "extraArgs" (concat ($srv.extraArgs | default list) ($p.extraArgs | default list)) }}
{{- $_ := set $eff "extraEnv" (concat ($srv.extraEnv | default list) ($p.extraEnv | default list)) }}
{{- $pools = append $pools $eff }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $pools }}
{{- end }}

{{- define "sglang-pd.poolSelectorLabels" -}}
{{ include "sglang-pd.selectorLabels" .root }}
app.kubernetes.io/component: {{ .pool.kind }}
sglang-pd.io/pool: {{ .pool.name }}
{{- end }}

{{/* The server's command line (args after the entrypoint). */}}
{{- define "sglang-pd.serverArgs" -}}
{{- $root := .root }}
{{- $pool := .pool }}
{{- $args := list "-m" "sglang_pd.launch_server" "--model-path" $root.Values.model.path "--mode" $pool.kind "--host" "0.0.0.0" "--port" (toString $root.Values.server.port) }}
{{- if eq $pool.kind "prefill" }}
{{- $args = concat $args (list "--disaggregation-bootstrap-port" (toString $root.Values.server.bootstrapPort)) }}
{{- end }}
{{- with $root.Values.model.servedName }}{{ $args = concat $args (list "--served-model-name" .) }}{{ end }}
{{- with $root.Values.model.tokenizerPath }}{{ $args = concat $args (list "--tokenizer-path" .) }}{{ end }}
{{- if include "sglang-pd.apiKeySecret" $root }}{{ $args = concat $args (list "--api-key" "$(SGLANG_PD_API_KEY)") }}{{ end }}
{{- with $root.Values.transfer.backend }}{{ $args = concat $args (list "--disaggregation-transfer-backend" .) }}{{ end }}
{{- with $root.Values.transfer.ibDevice }}{{ $args = concat $args (list "--disaggregation-ib-device" .) }}{{ end }}
{{- $args = concat $args (include "sglang-pd.flagList" $pool.engine | fromJsonArray) }}
{{- $s := $pool.scheduling }}
{{- $sched := dict }}
{{- if eq $pool.kind "prefill" }}
{{- $sched = dict "prefillPolicy" $s.prefillPolicy "prefillQueues" $s.prefillQueues "shortPrefillThreshold" $s.shortPrefillThreshold "prefillTimeBudgetMs" $s.prefillTimeBudgetMs }}
{{- if $pool.role }}{{ $_ := set $sched "prefillRole" $pool.role }}{{ end }}
{{- else }}
{{- $sched = dict "decodePolicy" $s.decodePolicy "tokenPacing" $s.tokenPacing }}
{{- end }}
{{- $_ := set $sched "sloTtftMs" $pool.slo.ttftMs }}
{{- $_ := set $sched "sloTpotMs" $pool.slo.tpotMs }}
{{- $args = concat $args (include "sglang-pd.flagList" $sched | fromJsonArray) }}
{{- $args = concat $args ($pool.extraArgs | default list) }}
{{- toJson $args }}
{{- end }}
