/**
 * Liveline for React Native: the JavaScript side asks for live activities and hears about tokens and states;
 * the native side does the platform work — ActivityKit and the Swift SDK `LivelineKit` on iOS, the Kotlin SDK
 * (`dev.liveline`) posting the ongoing / promoted notification on Android. Tokens are registered with Liveline
 * by the native SDKs themselves (also when JavaScript is not running); the events here are for the app's own use.
 */
import { NativeEventEmitter, NativeModules, Platform } from 'react-native';
import type { EmitterSubscription } from 'react-native';

/** A JSON value, as content states and attributes are. */
export type JSONValue = string | number | boolean | null | JSONValue[] | { [key: string]: JSONValue };
export type JSONObject = { [key: string]: JSONValue };

export interface LivelineOptions {
  /** The Liveline server, e.g. `https://liveline.example.com`. */
  serverUrl: string;
  /** The app's publishable key (`pk_…`). Never a secret key. */
  publishableKey: string;
  /** This installation's id; by default the native SDK makes one and keeps it. */
  deviceId?: string;
  /** The user, for remote starts' `audience.userIds`. */
  userId?: string;
  /** Tags, for remote starts' `audience.tags`. */
  tags?: Record<string, string>;
}

export interface StartActivityOptions {
  /** The Liveline activity id (`order-1234`): 1 to 128 of A-Z a-z 0-9 . _ : - */
  activityId: string;
  /**
   * The attributes type name. iOS: ignored — it is the Swift `ActivityAttributes` type the app registered
   * (`LivelineReactNative.use(MyAttributes.self)`); Android: sent to Liveline as `attributesType`.
   */
  attributesType?: string;
  /** The static attributes; on iOS they must decode into the registered attributes type. */
  attributes: JSONObject;
  /** The first content state; on iOS it must decode into the type's `ContentState`. */
  contentState: JSONObject;
  /** When the state becomes out of date. */
  staleDate?: Date;
}

export interface EndActivityOptions {
  /** iOS: the final content state shown until dismissal (default: the current one). */
  contentState?: JSONObject;
  /** iOS: remove it at once rather than after the system's default time. Android always removes it. */
  dismissImmediately?: boolean;
}

/** A token to send to your own backend, if it wants one; Liveline already has it. */
export interface UpdateTokenEvent {
  /**
   * iOS: the activity whose ActivityKit push token this is (hex). Android: `null` — the device's FCM token serves
   * every activity.
   */
  activityId: string | null;
  token: string;
}

/** iOS 17.2+: the push-to-start token of the registered attributes type (hex). Never sent on Android. */
export interface PushToStartTokenEvent {
  attributesType: string;
  token: string;
}

/** A live activity changed state on the phone. */
export interface ActivityStateEvent {
  activityId: string;
  /** `active` (a state was shown), `stale`, `ended` or `dismissed` (the user swiped it away). */
  state: 'active' | 'stale' | 'ended' | 'dismissed' | 'pending';
  /** Android: the Liveline sequence of the state shown, when one was. */
  sequence?: number;
  /** Android: the content state shown, when one was. */
  contentState?: JSONObject;
}

export interface LivelineEvents {
  updateToken: UpdateTokenEvent;
  pushToStartToken: PushToStartTokenEvent;
  activityState: ActivityStateEvent;
}

interface NativeLiveline {
  configure(options: LivelineOptions): Promise<string>;
  startActivity(options: {
    activityId: string;
    attributesType: string | null;
    attributes: JSONObject;
    contentState: JSONObject;
    staleDate: number | null;
  }): Promise<boolean>;
  endActivity(activityId: string, options: { contentState: JSONObject | null; dismissImmediately: boolean }): Promise<void>;
  addListener(eventName: string): void;
  removeListeners(count: number): void;
}

const LINKING_ERROR =
  `The native Liveline module is not linked. ${Platform.select({
    ios: 'iOS: add the files in ios/ to your app target and register your attributes type (README.md).',
    default: 'Android: rebuild the app after installing the package (autolinking).',
  })} Expo Go cannot load it: use a development build.`;

const native: NativeLiveline =
  (NativeModules.LivelineModule as NativeLiveline | undefined) ??
  (new Proxy({}, {
    get() {
      throw new Error(LINKING_ERROR);
    },
  }) as NativeLiveline);

// 1 to 128 of A-Z a-z 0-9 . _ : -, but not the dot segments . and .. (URL libraries remove them from a path).
const ID = /^(?!\.{1,2}$)[A-Za-z0-9._:-]{1,128}$/;

let emitter: NativeEventEmitter | undefined;
function events(): NativeEventEmitter {
  emitter ??= new NativeEventEmitter(NativeModules.LivelineModule);
  return emitter;
}

/**
 * Configures the native SDK and registers this device with Liveline. Resolves with the device id.
 * On Android the SDK can also be configured from the manifest (the Expo plugin does it), which lets pushes be
 * shown before any JavaScript runs; calling this as well is fine.
 */
export function configure(options: LivelineOptions): Promise<string> {
  if (!options.publishableKey.startsWith('pk_')) {
    return Promise.reject(new Error('publishableKey must be a publishable key (pk_…); a secret key never ships in an app.'));
  }
  if (options.deviceId !== undefined && !ID.test(options.deviceId)) {
    return Promise.reject(new Error('deviceId must be 1 to 128 of A-Z a-z 0-9 . _ : -'));
  }
  return native.configure(options);
}

/**
 * Starts a live activity on this phone and registers it with Liveline, whose updates then reach it.
 * iOS: an ActivityKit `Activity` of the registered attributes type; Android: the ongoing notification.
 * Resolves with whether it is shown (false when notifications are not allowed, or the id was used before).
 */
export function startActivity(options: StartActivityOptions): Promise<boolean> {
  if (!ID.test(options.activityId)) {
    return Promise.reject(new Error('activityId must be 1 to 128 of A-Z a-z 0-9 . _ : -'));
  }
  if (Platform.OS === 'android' && !options.attributesType) {
    return Promise.reject(new Error('attributesType is required on Android'));
  }
  return native.startActivity({
    activityId: options.activityId,
    attributesType: options.attributesType ?? null,
    attributes: options.attributes,
    contentState: options.contentState,
    staleDate: options.staleDate ? Math.floor(options.staleDate.getTime() / 1000) : null,
  });
}

/** Ends a live activity on this phone and reports `ended` to Liveline (the backend ends it with `POST …/end`). */
export function endActivity(activityId: string, options: EndActivityOptions = {}): Promise<void> {
  return native.endActivity(activityId, {
    contentState: options.contentState ?? null,
    dismissImmediately: options.dismissImmediately ?? false,
  });
}

/** Listens to one kind of event; call `remove()` on the result to stop. */
export function addListener<E extends keyof LivelineEvents>(
  event: E,
  listener: (payload: LivelineEvents[E]) => void,
): EmitterSubscription {
  return events().addListener(event, listener as (payload: unknown) => void);
}

export default { configure, startActivity, endActivity, addListener };
