{{- define "oz0.labels" -}}
app.kubernetes.io/name: oz0
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The environment every oz0 container shares: the secret's keys and the chart's settings. */}}
{{- define "oz0.env" -}}
- name: DATABASE_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: DATABASE_URL}}
- name: REDIS_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: REDIS_URL}}
- name: SECRET_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: SECRET_KEY}}
{{- range $name, $value := .Values.settings }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{- define "oz0.securityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
{{- end }}
