{{/* Names and labels. */}}
{{- define "differently.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "differently.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "differently.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "differently.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "api"). */}}
{{- define "differently.selector" -}}
app.kubernetes.io/name: {{ include "differently.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "differently.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "differently.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "differently.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding keys and URLs: the chart's own or an existing one. */}}
{{- define "differently.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else if .Values.secrets.create -}}
{{- include "differently.fullname" . -}}
{{- else -}}
{{- fail "secrets: set secrets.existingSecret, or secrets.create: true with the values" -}}
{{- end -}}
{{- end -}}

{{/* Where a pool's API key Secret is mounted. */}}
{{- define "differently.poolKeyDir" -}}
{{- printf "/etc/differently/pools/%s" . -}}
{{- end -}}

{{/*
A value as TOML: strings quoted (JSON escapes are TOML escapes), whole numbers as integers
(Helm reads every YAML number as a float, and the binary's integer fields refuse `16.0`),
lists as arrays, maps as inline tables with sorted, quoted keys.
*/}}
{{- define "differently.tomlValue" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}
{{- $v | toJson -}}
{{- else if kindIs "bool" $v -}}
{{- $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- if eq (float64 $v) (floor $v) -}}{{- int64 $v -}}{{- else -}}{{- $v -}}{{- end -}}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $e := $v -}}{{- if $i -}}, {{ end -}}{{- include "differently.tomlValue" $e -}}{{- end -}}]
{{- else if kindIs "map" $v -}}
{ {{- range $i, $k := keys $v | sortAlpha -}}{{- if $i -}}, {{ end -}}{{- include "differently.tomlKey" $k }} = {{ include "differently.tomlValue" (index $v $k) -}}{{- end -}} }
{{- else -}}
{{- fail (printf "config: cannot write %v (%s) as TOML" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* A TOML key: bare when it can be, quoted otherwise. */}}
{{- define "differently.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{- . -}}{{- else -}}{{- . | toJson -}}{{- end -}}
{{- end -}}

{{/* `key = value` lines of a map, sorted, skipping nulls. */}}
{{- define "differently.tomlTable" -}}
{{- $lines := list -}}
{{- range $k := keys . | sortAlpha -}}
{{- $v := index $ $k -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $lines = append $lines (printf "%s = %s" (include "differently.tomlKey" $k) (include "differently.tomlValue" $v)) -}}
{{- end -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{/* Environment every role gets: keys and URLs from the Secret, log level. */}}
{{- define "differently.env" -}}
{{- $secret := include "differently.secretName" . -}}
- name: DIFFERENTLY_DATABASE_URL
  valueFrom: { secretKeyRef: { name: {{ $secret }}, key: {{ .Values.secrets.keys.databaseURL }} } }
- name: DIFFERENTLY_NATS_URL
  valueFrom: { secretKeyRef: { name: {{ $secret }}, key: {{ .Values.secrets.keys.natsURL }} } }
- name: DIFFERENTLY_AUDIT_KEY
  valueFrom: { secretKeyRef: { name: {{ $secret }}, key: {{ .Values.secrets.keys.auditKey }} } }
- name: DIFFERENTLY_SECRETS_KEY
  valueFrom: { secretKeyRef: { name: {{ $secret }}, key: {{ .Values.secrets.keys.secretsKey }}, optional: true } }
- name: DIFFERENTLY_LOG
  value: {{ .Values.log | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Volumes every role mounts: the config, /tmp, pool credentials, extras. */}}
{{- define "differently.volumes" -}}
- name: config
  configMap:
    name: {{ include "differently.fullname" . }}
- name: tmp
  emptyDir: { sizeLimit: 64Mi }
{{- range .Values.pools }}
{{- $pool := .name }}
{{- with .apiKeySecretRef }}
- name: pool-{{ $pool }}
  secret:
    secretName: {{ required "pools[].apiKeySecretRef.name" .name }}
    defaultMode: 0400
    items:
      - key: {{ required "pools[].apiKeySecretRef.key" .key }}
        path: api-key
{{- end }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "differently.volumeMounts" -}}
- name: config
  mountPath: /etc/differently/config
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- range .Values.pools }}
{{- if .apiKeySecretRef }}
- name: pool-{{ .name }}
  mountPath: {{ include "differently.poolKeyDir" .name }}
  readOnly: true
{{- end }}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod-level settings every role shares (the migrate hook runs before the ServiceAccount
exists, so it names none and keeps the namespace's default, without a token). */}}
{{- define "differently.podCommon" -}}
{{- if not .hook -}}
serviceAccountName: {{ include "differently.serviceAccountName" .ctx }}
{{- end }}
automountServiceAccountToken: false
enableServiceLinks: false
terminationGracePeriodSeconds: {{ .ctx.Values.terminationGracePeriodSeconds }}
securityContext:
  {{- toYaml .ctx.Values.podSecurityContext | nindent 2 }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* `differently server` arguments of a role. */}}
{{- define "differently.configPath" -}}/etc/differently/config/differently.toml{{- end -}}

{{/*
A Deployment of a role that serves no API (scheduler, worker):
(dict "ctx" $ "component" "worker" "name" "…-worker-all" "replicas" 2 "args" (list …) "role" .Values.workers "group" "all").
Its only HTTP listener is /metrics, so that is what its probes ask: it answers once the
process has connected to Postgres and NATS and keeps answering while the runtime runs.
*/}}
{{- define "differently.roleDeployment" -}}
{{- $ := .ctx -}}
{{- $sel := dict "ctx" $ "component" .component -}}
{{- $role := .role -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  labels:
    {{- include "differently.labels" $ | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
    {{- with .group }}
    differently/worker-group: {{ . }}
    {{- end }}
spec:
  replicas: {{ .replicas }}
  selector:
    matchLabels:
      {{- include "differently.selector" $sel | nindent 6 }}
      {{- with .group }}
      differently/worker-group: {{ . }}
      {{- end }}
  strategy:
    type: RollingUpdate
    rollingUpdate: { maxUnavailable: 0, maxSurge: 1 }
  template:
    metadata:
      labels:
        {{- include "differently.selector" $sel | nindent 8 }}
        {{- with .group }}
        differently/worker-group: {{ . }}
        {{- end }}
      annotations:
        checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") $ | sha256sum }}
        {{- with $role.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- include "differently.podCommon" (dict "ctx" $) | nindent 6 }}
      containers:
        - name: {{ .component }}
          image: {{ include "differently.image" $ }}
          imagePullPolicy: {{ $.Values.image.pullPolicy }}
          command: [{{ $.Values.image.command | quote }}]
          args: {{ toJson .args }}
          env:
            {{- include "differently.env" $ | nindent 12 }}
          {{- if $.Values.metrics.enabled }}
          ports:
            - { name: metrics, containerPort: {{ $.Values.metrics.port }}, protocol: TCP }
          livenessProbe:
            httpGet: { path: /metrics, port: metrics }
            periodSeconds: 15
            timeoutSeconds: 5
            failureThreshold: 4
          readinessProbe:
            httpGet: { path: /metrics, port: metrics }
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 2
          startupProbe:
            httpGet: { path: /metrics, port: metrics }
            periodSeconds: 2
            failureThreshold: 60
          {{- end }}
          resources:
            {{- toYaml $role.resources | nindent 12 }}
          securityContext:
            {{- toYaml $.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "differently.volumeMounts" $ | nindent 12 }}
      volumes:
        {{- include "differently.volumes" $ | nindent 8 }}
      {{- with $role.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $role.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if $role.affinity }}
        {{- toYaml $role.affinity | nindent 8 }}
        {{- else }}
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "differently.selector" $sel | nindent 20 }}
        {{- end }}
{{- end -}}
