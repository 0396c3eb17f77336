{{/* The router: its static targets and command line. */}}

{{/* Prefill targets [{url, bootstrapPort}] and decode URLs of this release's pods (one per
     StatefulSet ordinal) and of router.externalWorkers. */}}
{{- define "sglang-pd.routerTargets" -}}
{{- $root := . }}
{{- $prefill := list }}
{{- $decode := list }}
{{- range $pool := include "sglang-pd.pools" . | fromJsonArray }}
{{- range $i := until (int $pool.replicas) }}
{{- $url := printf "http://%s-%d.%s.%s.svc.%s:%d" $pool.fullname $i $pool.fullname $root.Release.Namespace $root.Values.clusterDomain (int $root.Values.server.port) }}
{{- if eq $pool.kind "prefill" }}
{{- $prefill = append $prefill (dict "url" $url "bootstrapPort" $root.Values.server.bootstrapPort) }}
{{- else }}
{{- $decode = append $decode $url }}
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.router.externalWorkers.prefill }}
{{- $prefill = append $prefill . }}
{{- end }}
{{- $decode = concat $decode .Values.router.externalWorkers.decode }}
{{- toJson (dict "prefill" $prefill "decode" $decode) }}
{{- end }}

{{/* The router's command line (args after the entrypoint), for either implementation. */}}
{{- define "sglang-pd.routerArgs" -}}
{{- $v := .Values }}
{{- $r := $v.router }}
{{- $sglangRouter := eq $r.implementation "sglang-router" }}
{{- $args := list "-m" ($sglangRouter | ternary "sglang_router.launch_router" "sglang_pd_router") "--pd-disaggregation" "--host" "0.0.0.0" "--port" (toString $r.port) }}
{{- if $sglangRouter }}
{{- $args = concat $args (list "--prometheus-host" "0.0.0.0" "--prometheus-port" (toString $r.metricsPort) "--worker-startup-timeout-secs" (toString $r.startupTimeoutSeconds)) }}
{{- else if eq $r.discovery "labels" }}
{{- fail "router.discovery=labels needs router.implementation=sglang-router (sglang-pd-router takes static --prefill/--decode lists)" }}
{{- end }}
{{- if and $sglangRouter (or (not (kindIs "invalid" $r.shortPrefillThreshold)) (not (kindIs "invalid" $r.poolController))) }}
{{- fail "router.shortPrefillThreshold and router.poolController are sglang-pd-router settings; set router.implementation=sglang-pd-router" }}
{{- end }}
{{- if eq $r.discovery "labels" }}
{{- $sel := include "sglang-pd.selectorLabels" . | fromYaml }}
{{- $args = concat $args (list "--service-discovery" "--service-discovery-port" (toString $v.server.port) "--service-discovery-namespace" .Release.Namespace) }}
{{- range $kind := list "prefill" "decode" }}
{{- $args = append $args (printf "--%s-selector" $kind) }}
{{- range $k := keys $sel | sortAlpha }}
{{- $args = append $args (printf "%s=%s" $k (get $sel $k)) }}
{{- end }}
{{- $args = append $args (printf "app.kubernetes.io/component=%s" $kind) }}
{{- end }}
{{- end }}
{{- $targets := include "sglang-pd.routerTargets" . | fromJson }}
{{- if eq $r.discovery "static" }}
{{- if or (not $targets.prefill) (not $targets.decode) }}
{{- fail "the router needs at least one prefill and one decode: enable a pool or list router.externalWorkers" }}
{{- end }}
{{- range $targets.prefill }}
{{- $args = concat $args (list "--prefill" .url) }}
{{- if not (kindIs "invalid" .bootstrapPort) }}
{{- $args = append $args (include "sglang-pd.cliValue" .bootstrapPort) }}
{{- end }}
{{- end }}
{{- range $targets.decode }}
{{- $args = concat $args (list "--decode" .) }}
{{- end }}
{{- end }}
{{- $flags := dict "prefillPolicy" $r.prefillPolicy "decodePolicy" $r.decodePolicy "tokenizerPath" $r.tokenizerPath "shortPrefillThreshold" $r.shortPrefillThreshold "poolController" $r.poolController }}
{{- $args = concat $args (include "sglang-pd.flagList" $flags | fromJsonArray) }}
{{- if include "sglang-pd.apiKeySecret" . }}{{ $args = concat $args (list "--api-key" "$(SGLANG_PD_API_KEY)") }}{{ end }}
{{- $args = concat $args ($r.extraArgs | default list) }}
{{- toJson $args }}
{{- end }}
